"""A `command` agent for the diff-size test: writes `big.txt` with N
lines, then asks the broker to push the session's branch while claiming
a diff of its own (`diff.lines` = CLAIMED), and asks again with the same
seq while the call waits for an approval. Prints `CALL seq json` per
answer. Usage: python3 diff_agent.py N CLAIMED"""

import http.client
import json
import os
import sys
import time

OWN = "hatchery/" + os.environ["HATCHERY_SESSION_ID"]
N, CLAIMED = int(sys.argv[1]), int(sys.argv[2])

with open("big.txt", "w") as f:
    f.write("".join(f"line {i}\n" for i in range(N)))

body = json.dumps({"seq": 1, "tool": "git_push",
                   "args": {"branch": OWN, "message": "big", "diff": {"files": 1, "lines": CLAIMED}}})
deadline = time.time() + 240
while time.time() < deadline:
    try:
        c = http.client.HTTPConnection("127.0.0.1", 9200, timeout=60)
        c.request("POST", "/v1/invoke", body=body, headers={"Content-Type": "application/json"})
        r = c.getresponse()
        data = json.loads(r.read() or b"{}")
        c.close()
    except (OSError, http.client.HTTPException, ValueError):
        time.sleep(0.2)
        continue
    if r.status >= 500:
        time.sleep(0.2)
        continue
    print("CALL 1 %s" % json.dumps({"http": r.status, **data}, sort_keys=True), flush=True)
    if data.get("status") != "awaiting_approval":
        break
    time.sleep(0.5)
