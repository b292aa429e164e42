"""A `command` agent for the exactly-once test, run in the session's
sandbox: it calls the broker directly (127.0.0.1:9200) and prints one
line, `HAMMER {json}`, with what it saw."""

import asyncio
import http.client
import json
import os
import time

BROKER = ("127.0.0.1", 9200)
OWN = "hatchery/" + os.environ["HATCHERY_SESSION_ID"]


def call(seq, tool, args, headers=None):
    body = json.dumps({"seq": seq, "tool": tool, "args": args})
    for _ in range(100):
        try:
            c = http.client.HTTPConnection(*BROKER, timeout=120)
            c.request("POST", "/v1/invoke", body=body, headers={"Content-Type": "application/json", **(headers or {})})
            r = c.getresponse()
            data = json.loads(r.read() or b"{}")
            c.close()
            if r.status >= 500:
                raise OSError(f"{r.status}")
            return r.status, data
        except OSError:
            time.sleep(0.2)
    raise SystemExit("broker unreachable")


def pr(seq, title):
    return call(seq, "open_pr", {"title": title, "head": OWN, "body": "b"})


out = {}
# Every call three times with the same seq: one effect, the same answer.
retries = []
for seq in range(1, 6):
    got = [pr(seq, f"retry {seq}") for _ in range(3)]
    retries.append({"same": all(g == got[0] for g in got), "status": got[0][0],
                    "call": got[0][1].get("status"), "number": got[0][1].get("output", {}).get("number")})
out["retries"] = retries
# The same seq with other arguments is refused.
st, d = pr(1, "something else")
out["conflict"] = [st, d.get("error", {}).get("code")]
# A header naming another sandbox is replaced by the relay: the call is
# this sandbox's, as if the header were not there.
st, d = call(6, "open_pr", {"title": "forged", "head": OWN}, {"X-Hatchery-Sandbox": "sbx_someoneelse"})
out["forged"] = [st, d.get("status")]
# 50 distinct seqs at once (one connection each; the sandbox's thread
# limit is low, so asyncio), then all 50 again at once.
results = {}


async def apr(seq):
    body = json.dumps({"seq": seq, "tool": "open_pr",
                       "args": {"title": f"concurrent {seq}", "head": OWN, "body": "b"}}).encode()
    for _ in range(100):
        try:
            r, w = await asyncio.open_connection(*BROKER)
            w.write(b"POST /v1/invoke HTTP/1.1\r\nHost: broker\r\nContent-Type: application/json\r\n"
                    b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
            await w.drain()
            data = await r.read()
            w.close()
            head, _, payload = data.partition(b"\r\n\r\n")
            status = int(head.split()[1])
            if status >= 500:
                raise OSError(status)
            results.setdefault(seq, []).append((status, json.loads(payload)))
            return
        except (OSError, IndexError, ValueError):
            await asyncio.sleep(0.2)


async def waves():
    for _ in range(2):
        await asyncio.gather(*(apr(s) for s in range(100, 150)))


asyncio.run(waves())
numbers = {s: {r[1].get("output", {}).get("number") for r in rs} for s, rs in results.items()}
out["concurrent"] = {
    "seqs": len(results),
    "answers_per_seq": sorted({len(rs) for rs in results.values()}),
    "all_done": all(r[1].get("status") == "done" for rs in results.values() for r in rs),
    "one_number_per_seq": all(len(n) == 1 for n in numbers.values()),
    "distinct_numbers": len({next(iter(n)) for n in numbers.values()}),
}
print("HAMMER " + json.dumps(out), flush=True)
