"""A `command` agent that makes the broker calls listed in calls.json
([[seq, tool, args], ...]; "{own}" in a string is the session's branch)
and prints `CALL seq json` for each answer."""

import http.client
import json
import os
import time

OWN = "hatchery/" + os.environ["HATCHERY_SESSION_ID"]


def subst(v):
    if isinstance(v, str):
        return v.replace("{own}", OWN)
    if isinstance(v, dict):
        return {k: subst(x) for k, x in v.items()}
    return v


for seq, tool, args in json.load(open("calls.json")):
    body = json.dumps({"seq": seq, "tool": tool, "args": subst(args)})
    for _ in range(100):
        try:
            c = http.client.HTTPConnection("127.0.0.1", 9200, timeout=60)
            c.request("POST", "/v1/invoke", body=body, headers={"Content-Type": "application/json"})
            r = c.getresponse()
            data = json.loads(r.read() or b"{}")
            if r.status >= 500:
                # The broker says nothing was done (503) or failed inside:
                # asking again with the same seq is what retries are for.
                print("RETRY %d %d %s" % (seq, r.status, json.dumps(data)), flush=True)
                time.sleep(0.2)
                continue
            break
        except (OSError, ValueError):
            time.sleep(0.2)
    print("CALL %d %s" % (seq, json.dumps({"http": r.status, **data}, sort_keys=True)), flush=True)
