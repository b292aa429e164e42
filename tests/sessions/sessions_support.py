"""Helpers for the session tests: a daemon with the scripted model as a
host service, session calls, an SSE reader that can reconnect."""

import http.client
import json
import time

from harness import KEY, Daemon, wait_baked

MODEL_GUEST_PORT = 9100

# The demo repository: a failing test the agent fixes.
CALC_BROKEN = "def add(a, b):\n    return a - b\n"
# Not the same size as CALC_BROKEN: an edit within the same second that keeps
# the size would leave Python's cached bytecode looking fresh (pyc checks
# mtime seconds and size), and the old code would run again.
CALC_FIXED = "def add(a, b):\n    return a + b  # fixed\n"
TEST_CALC = (
    "import unittest\n\nfrom calc import add\n\n\n"
    "class T(unittest.TestCase):\n    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n\n\n"
    "if __name__ == '__main__':\n    unittest.main()\n"
)
DEMO_FILES = {"calc.py": CALC_BROKEN, "test_calc.py": TEST_CALC, "README.md": "A tiny calculator.\n"}

TEST_CMD = "python3 -m unittest -v test_calc 2>&1"

SCRIPTS = {
    # Read, run the tests (fail), edit, run again (pass), finish.
    "fix": [
        {"tool_calls": [{"name": "read_file", "arguments": {"path": "calc.py"}}]},
        {"tool_calls": [{"name": "shell", "arguments": {"command": TEST_CMD}}]},
        {"tool_calls": [{"name": "write_file", "arguments": {"path": "calc.py", "content": CALC_FIXED}}]},
        {"tool_calls": [{"name": "shell", "arguments": {"command": TEST_CMD}}]},
        {"tool_calls": [{"name": "finish", "arguments": {"summary": "fixed add(); tests pass"}}]},
    ],
    # Asks the user, then writes what it was told into a file.
    "ask": [
        {"content": "Which file name should I use?"},
        {"tool_calls": [{"name": "write_file", "arguments": {"path": "answer.txt", "content": "{last_user}"}}]},
        {"tool_calls": [{"name": "shell", "arguments": {"command": "cat answer.txt"}}]},
        {"tool_calls": [{"name": "finish", "arguments": {"summary": "wrote {last_user}"}}]},
    ],
    # Works slowly, so a test can act mid-run.
    "slow": [
        {"tool_calls": [{"name": "shell", "arguments": {"command": "sleep 4; echo one"}}]},
        {"tool_calls": [{"name": "shell", "arguments": {"command": "sleep 4; echo two"}}]},
        {"tool_calls": [{"name": "shell", "arguments": {"command": "echo '{last_user}' > steer.txt"}}]},
        {"tool_calls": [{"name": "finish", "arguments": {"summary": "done slowly"}}]},
    ],
    # Steered mid-run, then cancelled during a long command.
    "steer": [
        {"tool_calls": [{"name": "shell", "arguments": {"command": "sleep 3; echo one"}}]},
        {"tool_calls": [{"name": "shell", "arguments": {"command": "echo '{last_user}' > steer.txt"}}]},
        {"tool_calls": [{"name": "shell", "arguments": {"command": "sleep 120"}}]},
        {"tool_calls": [{"name": "finish", "arguments": {"summary": "not cancelled"}}]},
    ],
    # Done at once (session start figures).
    "quick": [
        {"tool_calls": [{"name": "finish", "arguments": {"summary": "nothing to do"}}]},
    ],
    # mini-swe-agent's own protocol: one `bash` tool; it finishes when a
    # command prints COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT first.
    "mini-fix": [
        {"content": "Let me look at the code and run the tests.",
         "tool_calls": [{"name": "bash", "arguments": {"command": "cat calc.py && " + TEST_CMD}}]},
        {"content": "add() subtracts; fixing it.",
         "tool_calls": [{"name": "bash", "arguments": {
             "command": "sed -i 's/return a - b/return a + b  # fixed/' calc.py && " + TEST_CMD}}]},
        {"content": "The tests pass.",
         "tool_calls": [{"name": "bash", "arguments": {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}}]},
    ],
    # Answers its second step differently when asked again (a re-run after
    # a resume from a checkpoint): test_sessions_replay.py. The first
    # step's sleep holds the agent while the checkpoint is taken; the
    # first answer's sleep holds it while the test loses the sandbox.
    "diverge": [
        {"tool_calls": [{"name": "shell", "arguments": {"command": "sleep 14; echo one"}}]},
        {"tool_calls": [{"name": "shell", "arguments": {"command": "echo first > pick.txt; sleep 120"}}],
         "again": {"tool_calls": [{"name": "shell", "arguments": {"command": "echo second > pick.txt"}}]}},
        {"tool_calls": [{"name": "shell", "arguments": {"command": "cat pick.txt"}}]},
        {"tool_calls": [{"name": "finish", "arguments": {"summary": "picked"}}]},
    ],
    "approve": [
        {"tool_calls": [{"name": "request_approval", "arguments": {"action": "git_push", "details": "main"}}]},
        {"tool_calls": [{"name": "shell", "arguments": {"command": "echo approved > pushed.txt"}}]},
        {"tool_calls": [{"name": "finish", "arguments": {"summary": "pushed"}}]},
    ],
}


class SessionDaemon(Daemon):
    def __init__(self, model_port, extra=(), data_dir=None, net_args=None, templates_dir=None, netns=None,
                 model_host="127.0.0.1", gateway=None, gateway_control=None):
        """gateway: (prices file, upstream key file) to reach the model
        through the daemon's model gateway (metered against the session's
        budget) instead of a plain host service. gateway_control: the
        control plane's URL, whose gateway a host relays its calls to."""
        if gateway_control:
            model = ["--gateway-control-url", gateway_control]
        elif gateway:
            prices, keyf = gateway
            model = ["--gateway-openai-upstream", f"http://{model_host}:{model_port}",
                     "--gateway-prices", prices, "--gateway-upstream-key-file", keyf]
        else:
            model = ["--host-service", f"model={MODEL_GUEST_PORT}={model_host}:{model_port}",
                     "--sessions-model-url", f"http://127.0.0.1:{MODEL_GUEST_PORT}/v1"]
        args = ["--max-ttl", "7200", *([] if "--pool-size" in extra else ["--pool-size", "1"]),
                *model, "--sessions-model", "scripted", *extra]
        if net_args:
            args += net_args
        super().__init__(extra_args=args, data_dir=data_dir, templates_dir=templates_dir, netns=netns)

    def start(self):
        super().start()
        return self

    def new_session(self, repo, task, **kw):
        body = {"repo": repo, "task": task, **kw}
        r = self.request("POST", "/v1/sessions", body)
        assert r.status == 201, r
        return r.json()["session_id"]

    def session(self, sid):
        r = self.request("GET", f"/v1/sessions/{sid}")
        assert r.status == 200, r
        return r.json()

    def events_page(self, sid, after=0, limit=1000):
        r = self.request("GET", f"/v1/sessions/{sid}/events?after={after}&limit={limit}")
        assert r.status == 200, r
        return r.json()

    def all_events(self, sid):
        out, after = [], 0
        while True:
            p = self.events_page(sid, after)
            out += p["events"]
            if not p["has_more"]:
                return out
            after = out[-1]["seq"]

    def wait_state(self, sid, states, timeout=240):
        states = {states} if isinstance(states, str) else set(states)
        deadline = time.time() + timeout
        s = None
        while time.time() < deadline:
            s = self.session(sid)
            if s["state"] in states:
                return s
            if s["state"] in ("completed", "failed", "cancelled"):
                raise AssertionError(f"session ended {s['state']}: {s.get('reason')}\n{self.log()[-3000:]}")
            time.sleep(0.2)
        raise AssertionError(f"session {sid} not in {states} after {timeout}s: {s}\n{self.log()[-3000:]}")

    def wait_event(self, sid, type_, timeout=240, after=0):
        deadline = time.time() + timeout
        while time.time() < deadline:
            for e in self.all_events(sid):
                if e["type"] == type_ and e["seq"] > after:
                    return e
            s = self.session(sid)
            if s["state"] in ("completed", "failed", "cancelled"):
                raise AssertionError(f"session ended {s['state']} ({s.get('reason')}) before a {type_} event")
            time.sleep(0.2)
        raise AssertionError(f"no {type_} event in {sid} after {timeout}s")

    def track_sandboxes(self, sid):
        for e in self.all_events(sid):
            if e["type"] in ("sandbox_ready",):
                self.created.add(e["sandbox_id"])
            if e["type"] in ("resumed", "resumed_from_checkpoint"):
                self.created.add(e["sandbox_id"])

    def _wait_sessions_ended(self, timeout):
        deadline = time.time() + timeout
        while time.time() < deadline:
            r = self.request("GET", "/v1/sessions?limit=1000")
            if r.status != 200 or _ended(r.json()["sessions"]):
                for s in r.json()["sessions"] if r.status == 200 else []:
                    self.track_sandboxes(s["session_id"])
                return
            time.sleep(0.25)

    def cleanup_sessions(self):
        """Cancel what still runs, then the harness teardown: no sandbox,
        process, mount or netns may be left."""
        try:
            if self.proc and self.proc.poll() is None:
                r = self.request("GET", "/v1/sessions?limit=1000")
                if r.status == 200:
                    for s in r.json()["sessions"]:
                        self.track_sandboxes(s["session_id"])
                        if s["state"] not in ("completed", "failed", "cancelled"):
                            self.request("POST", f"/v1/sessions/{s['session_id']}:cancel")
                    # A session cancelled while its sandbox was being made
                    # ends (and deletes that sandbox) in its runner, after
                    # the cancel answered: wait for it, or the daemon's
                    # stop leaves the sandbox running (sandboxes outlive
                    # the daemon on purpose). Bounded; the leak check after
                    # says what is left.
                    self._wait_sessions_ended(60)
                # Review and idle snapshots are kept on purpose; remove them
                # here so the data dir goes too.
                r = self.request("GET", "/v1/snapshots")
                if r.status == 200:
                    for sn in r.json()["snapshots"]:
                        self.request("DELETE", f"/v1/snapshots/{sn['id']}")
        finally:
            self.cleanup()


def _ended(sessions):
    return all(s["state"] in ("completed", "failed", "cancelled", "idle") for s in sessions)


def sse_events(port, sid, after=None, last_event_id=None, stop_after=None, timeout=240):
    """Reads the session's SSE stream; returns [(id, event, data)] until the
    server ends it or `stop_after` events were read (then it disconnects)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    path = f"/v1/sessions/{sid}/events" + (f"?after={after}" if after is not None else "")
    h = {"Authorization": f"Bearer {KEY}", "Accept": "text/event-stream"}
    if last_event_id is not None:
        h["Last-Event-ID"] = str(last_event_id)
    conn.request("GET", path, headers=h)
    r = conn.getresponse()
    assert r.status == 200, (r.status, r.read())
    out, eid, ev, data = [], None, None, []
    while True:
        line = r.readline()
        if not line:
            break
        line = line.decode().rstrip("\n")
        if line.startswith("id:"):
            eid = int(line[3:].strip())
        elif line.startswith("event:"):
            ev = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].lstrip())
        elif line == "" and ev:
            out.append((eid, ev, json.loads("\n".join(data))))
            eid, ev, data = None, None, []
            if stop_after is not None and len(out) >= stop_after:
                break
    conn.close()
    return out
