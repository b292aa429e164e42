"""A deterministic scripted model server speaking the OpenAI
chat-completions API (tool calls, and streaming when asked). It is the
test double for a remote model service; everything around it is real.

Scripts are lists of turns. The script is picked by a `[script:NAME]`
tag in the conversation's first user message, and the turn by how many
assistant messages the conversation already has, so concurrent sessions
each get their own deterministic play. A turn is
  {"tool_calls": [{"name": "shell", "arguments": {...}}, ...]}  or
  {"content": "text"}
and `{last_user}` in any string is replaced by the text of the
conversation's last user message (a steering message shows up that way).
A turn with `"usage": {"prompt_tokens", "completion_tokens"}` reports that
instead of its real size (a model that lies about what a call cost); one
with `"overbill": F` reports F times the most the gateway can have
reserved for the request as it arrived (its bytes, the tool-use allowance
of 2,048 and its max_tokens; docs/gateway.md, "Budgets"): with F = 2, a
model whose every lie is one reservation above the reservation. Each request's
record keeps the usage reported for it (`usage`). One
with `"delay_s": N` holds the call N seconds before answering (a slow
model, to kill a daemon while a call is at the upstream). A turn with
`"again": TURN` plays TURN instead whenever the same conversation (the
same first user message) asks for that step a second time: a model that
answers differently when a resumed agent re-runs its call.

Run standalone: python3 scripted_model.py SCRIPTS.json [PORT]
"""

import json
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def _subst(v, last_user):
    if isinstance(v, str):
        return v.replace("{last_user}", last_user)
    if isinstance(v, dict):
        return {k: _subst(x, last_user) for k, x in v.items()}
    if isinstance(v, list):
        return [_subst(x, last_user) for x in v]
    return v


class ScriptedModel:
    def __init__(self, scripts, port=0, host="127.0.0.1"):
        self.scripts = scripts
        self.requests = []
        self.lock = threading.Lock()
        # How often each (first user message, step) was asked, for `again`.
        self.asked = {}
        model = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Headers and body are two writes: with Nagle, the body waits
            # for the client's delayed ACK of the headers (40 ms), which
            # made a model call through a host's gateway look like 60 ms
            # (docs/benchmarks.md). Real upstreams do not stall so.
            disable_nagle_algorithm = True

            def log_message(self, *a):
                pass

            def do_GET(self):
                if self.path.rstrip("/").endswith("/models"):
                    self._json(200, {"object": "list", "data": [{"id": "scripted", "object": "model"}]})
                else:
                    self._json(404, {"error": {"message": "not found"}})

            def do_POST(self):
                n = int(self.headers.get("Content-Length") or 0)
                try:
                    req = json.loads(self.rfile.read(n) or b"{}")
                except ValueError:
                    return self._json(400, {"error": {"message": "bad json"}})
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    return self._json(404, {"error": {"message": "not found"}})
                rec = {"sandbox": self.headers.get("X-Hatchery-Sandbox"), "body": req}
                with model.lock:
                    model.requests.append(rec)
                turn, usage = model.answer(req, n)
                rec["usage"] = usage
                time.sleep(float(turn.pop("delay_s", 0)))
                if req.get("stream"):
                    return self._stream(req, turn, usage)
                self._json(200, model.completion(req, turn, usage))

            def _json(self, code, obj):
                b = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(b)))
                self.end_headers()
                self.wfile.write(b)

            def _stream(self, req, turn, usage):
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Connection", "close")
                self.end_headers()
                base = {"id": "chatcmpl-scripted", "object": "chat.completion.chunk", "created": int(time.time()),
                        "model": req.get("model", "scripted")}

                def send(delta, finish=None, extra=None):
                    c = dict(base, choices=[{"index": 0, "delta": delta, "finish_reason": finish}], **(extra or {}))
                    self.wfile.write(b"data: " + json.dumps(c).encode() + b"\n\n")
                    self.wfile.flush()

                send({"role": "assistant"})
                if turn.get("content"):
                    text = turn["content"]
                    for i in range(0, len(text), 16):
                        send({"content": text[i:i + 16]})
                for i, tc in enumerate(model.tool_calls(turn)):
                    send({"tool_calls": [{"index": i, "id": tc["id"], "type": "function",
                                          "function": {"name": tc["function"]["name"], "arguments": ""}}]})
                    args = tc["function"]["arguments"]
                    for j in range(0, len(args), 32):
                        send({"tool_calls": [{"index": i, "function": {"arguments": args[j:j + 32]}}]})
                send({}, "tool_calls" if turn.get("tool_calls") else "stop", {"usage": usage})
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
                self.close_connection = True

        self.host = host
        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self):
        self.thread.start()
        return self

    def stop(self):
        self.server.shutdown()
        self.server.server_close()

    def answer(self, req, size=0):
        msgs = req.get("messages") or []
        users = [m for m in msgs if m.get("role") == "user"]
        first = _text(users[0]) if users else ""
        m = re.search(r"\[script:([a-z0-9_-]+)\]", first)
        script = self.scripts.get(m.group(1) if m else "default") or [{"content": "no script"}]
        step = sum(1 for m in msgs if m.get("role") == "assistant")
        turn = script[step] if step < len(script) else script[-1]
        with self.lock:
            seen = self.asked.get((first, step), 0)
            self.asked[(first, step)] = seen + 1
        turn = turn.get("again", turn) if seen else turn
        turn = {k: v for k, v in turn.items() if k != "again"}
        turn = dict(_subst(turn, _text(users[-1]) if users else ""), _step=step)
        prompt = sum(len(json.dumps(m)) for m in msgs) // 4
        usage = {"prompt_tokens": prompt, "completion_tokens": len(json.dumps(turn)) // 4 + 1}
        usage.update(turn.pop("usage", None) or {})
        over = turn.pop("overbill", None)
        if over is not None:
            tools = 2048 if req.get("tools") else 0
            asked = req.get("max_completion_tokens") or req.get("max_tokens") or 0
            usage = {"prompt_tokens": over * (size + tools), "completion_tokens": over * asked}
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        return turn, usage

    def tool_calls(self, turn):
        out = []
        for i, c in enumerate(turn.get("tool_calls") or []):
            args = c.get("arguments", {})
            out.append({"id": c.get("id") or f"call_{turn.get('_step', 0)}_{i}", "type": "function",
                        "function": {"name": c["name"], "arguments": args if isinstance(args, str) else json.dumps(args)}})
        return out

    def completion(self, req, turn, usage):
        calls = self.tool_calls(turn)
        msg = {"role": "assistant", "content": turn.get("content")}
        if calls:
            msg["tool_calls"] = calls
        return {"id": "chatcmpl-scripted", "object": "chat.completion", "created": int(time.time()),
                "model": req.get("model", "scripted"),
                "choices": [{"index": 0, "message": msg, "finish_reason": "tool_calls" if calls else "stop"}],
                "usage": usage}


def _text(m):
    c = m.get("content")
    if isinstance(c, list):
        return "".join(p.get("text", "") for p in c if isinstance(p, dict))
    return c or ""


if __name__ == "__main__":
    s = ScriptedModel(json.load(open(sys.argv[1])), int(sys.argv[2]) if len(sys.argv) > 2 else 0).start()
    print(s.port, flush=True)
    s.thread.join()
