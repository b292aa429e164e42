"""A `command` agent for the MCP tests: prints what GET /v1/tools offers
(`TOOLS json`, a summary), then makes the broker calls in calls.json
([[seq, tool, args, opts], ...]; opts: `repeat` sends the same seq that
many times, `wait` asks again until an approval is decided) and prints
`CALL seq json` for each answer."""

import http.client
import json
import time


def request(method, path, body=None):
    for _ in range(150):
        try:
            c = http.client.HTTPConnection("127.0.0.1", 9200, timeout=120)
            c.request(method, path, body=body, headers={"Content-Type": "application/json"})
            r = c.getresponse()
            data = json.loads(r.read() or b"{}")
            if r.status == 503:
                # Nothing was done (e.g. the MCP server is restarting): ask again.
                print("RETRY %s" % json.dumps(data), flush=True)
                time.sleep(0.3)
                continue
            return r.status, data
        except (OSError, ValueError):
            time.sleep(0.3)
    raise SystemExit("broker unreachable")


_, tools = request("GET", "/v1/tools")
summary = {t["name"]: {"server": t["server"],
                       "description_bytes": len(t.get("untrusted", {}).get("description", "")),
                       "annotations": t.get("untrusted", {}).get("annotations")}
           for t in tools["tools"]}
print("TOOLS " + json.dumps({"tools": summary, "errors": tools["errors"]}, sort_keys=True), flush=True)

for seq, tool, args, opts in json.load(open("calls.json")):
    body = json.dumps({"seq": seq, "tool": tool, "args": args})
    for _ in range(opts.get("repeat", 1)):
        status, data = request("POST", "/v1/invoke", body)
        while opts.get("wait") and data.get("status") == "awaiting_approval":
            time.sleep(0.3)
            status, data = request("POST", "/v1/invoke", body)
        # Long texts are cut (an agent output line is capped); their length stays.
        for c in (data.get("output") or {}).get("content") or []:
            if isinstance(c, dict) and len(c.get("text", "")) > 1000:
                c["text_len"], c["text"] = len(c["text"]), c["text"][:100]
        print("CALL %d %s" % (seq, json.dumps({"http": status, **data}, sort_keys=True)), flush=True)
