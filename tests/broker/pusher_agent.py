"""A `command` agent for the crash test: N pushes of the session's branch,
each a new work tree, each asked again (same seq) until the broker
answers, however often the daemon dies meanwhile. Prints `PUSH seq json`
per call."""

import http.client
import json
import os
import sys
import time

BROKER = ("127.0.0.1", 9200)
OWN = "hatchery/" + os.environ["HATCHERY_SESSION_ID"]
N = int(sys.argv[1])


def call(seq, args):
    body = json.dumps({"seq": seq, "tool": "git_push", "args": args})
    deadline = time.time() + 240
    while time.time() < deadline:
        try:
            c = http.client.HTTPConnection(*BROKER, timeout=60)
            c.request("POST", "/v1/invoke", body=body, headers={"Content-Type": "application/json"})
            r = c.getresponse()
            data = json.loads(r.read() or b"{}")
            c.close()
            if r.status == 200:
                return data
        except (OSError, http.client.HTTPException, ValueError):
            pass
        time.sleep(0.1)
    raise SystemExit(f"no answer for seq {seq}")


for seq in range(1, N + 1):
    with open("step.txt", "w") as f:
        f.write(f"step {seq}\n")
    r = call(seq, {"branch": OWN, "message": f"step {seq}"})
    print("PUSH %d %s" % (seq, json.dumps(r, sort_keys=True)), flush=True)
