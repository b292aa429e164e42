#!/usr/bin/env python3
"""Hatchery's reference agent: runs inside the session's sandbox.

It asks an OpenAI-compatible chat-completions endpoint (the session's
model URL, reached through a host service) for the next step and runs
the tools the model calls: `shell`, `read_file`, `write_file`, plus
`request_approval` and `finish`, and the broker's tools (`git_push`,
`open_pr`, `http_fetch`), which it asks the tool broker to run (at
127.0.0.1:9200, a host service: the credentials stay on the host). It reports every step to the session
runner as one JSON line on stdout, and reads acks, steering messages and
approval decisions as JSON lines on stdin. A tool runs only after the
runner has acknowledged its `tool_call` line, so the event is in the log
before the effect. Standard library only.
"""

import http.client
import json
import os
import queue
import subprocess
import sys
import threading
import time
import urllib.parse

MAX_OUTPUT = 64 * 1024
SYSTEM = (
    "You are a coding agent working in a git checkout at {workdir}. Use the tools to read "
    "and change files and to run commands (tests). Call finish with a short summary when "
    "the task is done. If you need something from the user, answer without a tool call and wait."
)
TOOLS = [
    {"type": "function", "function": {
        "name": "shell", "description": "Run a shell command in the checkout; returns exit code and output.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}},
    {"type": "function", "function": {
        "name": "read_file", "description": "Read a text file (path relative to the checkout).",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}},
    {"type": "function", "function": {
        "name": "write_file", "description": "Write a text file (path relative to the checkout).",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                       "required": ["path", "content"]}}},
    {"type": "function", "function": {
        "name": "request_approval", "description": "Ask a human to approve an action before doing it.",
        "parameters": {"type": "object", "properties": {"action": {"type": "string"}, "details": {"type": "string"}},
                       "required": ["action"]}}},
    {"type": "function", "function": {
        "name": "git_push", "description": "Commit the checkout's work tree and push it to a branch of the "
        "repository's remote (through the tool broker; your own branch is hatchery/<session id>).",
        "parameters": {"type": "object", "properties": {"branch": {"type": "string"}, "message": {"type": "string"}},
                       "required": ["branch"]}}},
    {"type": "function", "function": {
        "name": "open_pr", "description": "Open a pull request from a pushed branch (through the tool broker).",
        "parameters": {"type": "object", "properties": {"title": {"type": "string"}, "body": {"type": "string"},
                                                        "head": {"type": "string"}, "base": {"type": "string"}},
                       "required": ["title"]}}},
    {"type": "function", "function": {
        "name": "http_fetch", "description": "Fetch a URL through the tool broker (policy decides).",
        "parameters": {"type": "object", "properties": {"url": {"type": "string"}, "method": {"type": "string"},
                                                        "body": {"type": "string"}},
                       "required": ["url"]}}},
    {"type": "function", "function": {
        "name": "finish", "description": "The task is done.",
        "parameters": {"type": "object", "properties": {"summary": {"type": "string"}}}}},
]

_out_lock = threading.Lock()
_n = [0]
_acks = {}
_ack_cv = threading.Condition()
_inbox = queue.Queue()        # steering messages: (seq, text)
_decisions = queue.Queue()    # approval decisions: dict
_seen_seq = [0]


def emit(kind, ack=False, **fields):
    with _out_lock:
        _n[0] += 1
        n = _n[0]
        line = dict(fields, n=n, type=kind)
        if ack:
            line["ack"] = True
        sys.stdout.write(json.dumps(line) + "\n")
        sys.stdout.flush()
    if ack:
        with _ack_cv:
            while n not in _acks:
                _ack_cv.wait()
    return n


def reader():
    for raw in sys.stdin:
        try:
            m = json.loads(raw)
        except ValueError:
            continue
        t = m.get("type")
        if t == "ack":
            with _ack_cv:
                _acks[m.get("n")] = True
                _ack_cv.notify_all()
        elif t in ("message", "approval"):
            seq = int(m.get("seq", 0))
            # A re-delivery after a daemon restart repeats what we have.
            if seq <= _seen_seq[0]:
                continue
            _seen_seq[0] = seq
            (_inbox if t == "message" else _decisions).put(m)


def cap(s):
    return s if len(s) <= MAX_OUTPUT else s[:MAX_OUTPUT] + "\n[output cut]"


_conn = [None]


def chat(conf, messages):
    """One chat-completions call on a kept-alive connection (one relayed
    connection for the whole session), made again after any failure."""
    body = json.dumps({"model": conf["model"], "messages": messages, "tools": TOOLS,
                       "tool_choice": "auto"}).encode()
    u = urllib.parse.urlsplit(conf["model_url"].rstrip("/") + "/chat/completions")
    path = u.path + (("?" + u.query) if u.query else "")
    headers = {"Content-Type": "application/json",
               "Authorization": "Bearer " + os.environ.get("OPENAI_API_KEY", "")}
    last = None
    for attempt in range(8):
        try:
            if _conn[0] is None:
                cls = http.client.HTTPSConnection if u.scheme == "https" else http.client.HTTPConnection
                _conn[0] = cls(u.hostname, u.port, timeout=300)
            _conn[0].request("POST", path, body=body, headers=headers)
            r = _conn[0].getresponse()
            data = r.read()
            if r.status >= 500:
                raise http.client.HTTPException(f"HTTP {r.status}: {data[:200]!r}")
            if r.status != 200:
                raise RuntimeError(f"model endpoint answered {r.status}: {data[:500]!r}")
            return json.loads(data)
        except (http.client.HTTPException, OSError, ValueError) as e:
            # A blip on the way to the model (the relay, the gateway):
            # asking again is safe, the model call has no side effect.
            last = e
            try:
                _conn[0].close()
            except Exception:
                pass
            _conn[0] = None
            print(f"model call failed ({e!r}); retrying", file=sys.stderr, flush=True)
            time.sleep(min(0.25 * (2 ** attempt), 4))
    raise RuntimeError(f"model endpoint {conf['model_url']} failed: {last}")


def safe_path(workdir, p):
    full = os.path.normpath(os.path.join(workdir, p))
    return full


def run_tool(conf, call_id, name, args):
    wd = conf["workdir"]
    if name == "shell":
        cmd = str(args.get("command", ""))
        t0 = time.time()
        try:
            r = subprocess.run(cmd, shell=True, cwd=wd, capture_output=True, timeout=600)
            code, out = r.returncode, (r.stdout + r.stderr).decode("utf-8", "replace")
        except subprocess.TimeoutExpired:
            code, out = 124, "timed out after 600 s"
        out = cap(out)
        emit("command_run", call_id=call_id, command=cmd, exit_code=code,
             duration_ms=int((time.time() - t0) * 1000), output=out)
        return f"exit code {code}\n{out}"
    if name == "read_file":
        path = safe_path(wd, str(args.get("path", "")))
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                out, ok = cap(f.read()), True
        except OSError as e:
            out, ok = f"error: {e}", False
        emit("tool_result", call_id=call_id, tool=name, ok=ok, output=out)
        return out
    if name == "write_file":
        path = safe_path(wd, str(args.get("path", "")))
        content = str(args.get("content", ""))
        try:
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            with open(path, "w", encoding="utf-8") as f:
                f.write(content)
            emit("file_changed", call_id=call_id, path=path, bytes=len(content.encode()))
            out, ok = f"wrote {len(content.encode())} bytes to {path}", True
        except OSError as e:
            out, ok = f"error: {e}", False
        emit("tool_result", call_id=call_id, tool=name, ok=ok, output=out)
        return out
    out = f"unknown tool {name}"
    emit("tool_result", call_id=call_id, tool=name, ok=False, output=out)
    return out


BROKER_TOOLS = ("git_push", "open_pr", "http_fetch")
BROKER = ("127.0.0.1", 9200)


def broker_call(seq, tool, args):
    """One broker call under the key `seq`, asked again (same seq, same
    arguments) after any failure: the broker runs it at most once and
    answers a repeat with the stored result. While it needs an approval,
    waits for the decision (or polls) and asks again."""
    body = json.dumps({"seq": seq, "tool": tool, "args": args}).encode()
    attempt, waited = 0, False
    unknown_until = time.time() + 60
    while True:
        try:
            c = http.client.HTTPConnection(*BROKER, timeout=600)
            c.request("POST", "/v1/invoke", body=body, headers={"Content-Type": "application/json"})
            r = c.getresponse()
            data = json.loads(r.read() or b"{}")
            c.close()
        except (http.client.HTTPException, OSError, ValueError) as e:
            attempt += 1
            print(f"broker call {seq} failed ({e!r}); asking again", file=sys.stderr, flush=True)
            time.sleep(min(0.25 * (2 ** min(attempt, 4)), 4))
            continue
        if r.status >= 500 or r.status == 503:
            attempt += 1
            time.sleep(min(0.25 * (2 ** min(attempt, 4)), 4))
            continue
        code = (data.get("error") or {}).get("code") if isinstance(data.get("error"), dict) else None
        if r.status == 403 and code == "unknown_sandbox" and unknown_until > time.time():
            # Just resumed from a snapshot: the runner may not have recorded
            # this new sandbox as the session's yet.
            time.sleep(0.25)
            continue
        if r.status != 200:
            return {"status": "error", "allowed": False, "output": data.get("error", data)}
        if not data.get("needs_approval"):
            return data
        if not waited:
            emit("waiting", waiting_for="approval")
            waited = True
        try:
            _decisions.get(timeout=2)
        except queue.Empty:
            pass
        unknown_until = time.time() + 60


def take_messages(messages, block):
    got = False
    while True:
        try:
            m = _inbox.get(block=block and not got)
        except queue.Empty:
            return got
        messages.append({"role": "user", "content": m.get("text", "")})
        emit("message_received", seq=int(m.get("seq", 0)))
        got = True


def main():
    conf = json.load(open(sys.argv[1]))
    threading.Thread(target=reader, daemon=True).start()
    messages = [{"role": "system", "content": SYSTEM.format(workdir=conf["workdir"])},
                {"role": "user", "content": conf["task"]}]
    for step in range(1, int(conf.get("max_steps", 30)) + 1):
        take_messages(messages, block=False)
        emit("model_request", step=step, messages=len(messages))
        resp = chat(conf, messages)
        msg = (resp.get("choices") or [{}])[0].get("message") or {}
        calls = msg.get("tool_calls") or []
        emit("model_response", step=step, content=msg.get("content"),
             tool_calls=[{"id": c.get("id", ""), "name": c["function"]["name"],
                          "arguments": c["function"].get("arguments", "")} for c in calls],
             usage=resp.get("usage") or {})
        messages.append({"role": "assistant", "content": msg.get("content"), **({"tool_calls": calls} if calls else {})})
        if not calls:
            if msg.get("content"):
                emit("agent_message", text=msg["content"])
            emit("waiting", waiting_for="message")
            take_messages(messages, block=True)
            continue
        for c in calls:
            name = c["function"]["name"]
            try:
                args = json.loads(c["function"].get("arguments") or "{}")
            except ValueError:
                args = {}
            cid = c.get("id", "")
            if name == "finish":
                emit("done", summary=str(args.get("summary", "")))
                return 0
            if name == "request_approval":
                emit("approval_request", ack=True, action=str(args.get("action", "")),
                     details=str(args.get("details", "")))
                d = _decisions.get()
                result = f"{d.get('decision')}: {d.get('note', '')}"
                emit("tool_result", call_id=cid, tool=name, ok=d.get("decision") == "approve", output=result)
            elif name in BROKER_TOOLS:
                n = emit("tool_call", ack=True, call_id=cid, tool=name, arguments=c["function"].get("arguments", ""))
                args = args if isinstance(args, dict) else {}
                own = "hatchery/" + os.environ.get("HATCHERY_SESSION_ID", "")
                if name == "git_push":
                    args.setdefault("branch", own)
                elif name == "open_pr":
                    args.setdefault("head", own)
                r = broker_call(n, name, args)
                result = json.dumps(r)
                emit("tool_result", call_id=cid, tool=name, ok=r.get("status") == "done", output=cap(result))
            else:
                emit("tool_call", ack=True, call_id=cid, tool=name, arguments=c["function"].get("arguments", ""))
                result = run_tool(conf, cid, name, args)
            messages.append({"role": "tool", "tool_call_id": cid, "content": result})
    emit("error", message=f"stopped after max_steps={conf.get('max_steps')} model calls")
    return 3


if __name__ == "__main__":
    sys.exit(main())
