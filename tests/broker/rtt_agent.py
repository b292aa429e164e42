"""A `command` agent for `make bench`: broker round trips from inside
the sandbox on one kept-alive connection (new `noop` calls, repeats of a
stored call) and, as the baseline, the same relay and server without any
broker work (GET /v1/ping). Prints `BENCH json` (microseconds)."""

import http.client
import json
import time

N = 300


def timed(conn, method, path, body=None):
    t = time.perf_counter()
    conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    r.read()
    assert r.status == 200, r.status
    return (time.perf_counter() - t) * 1e6


def pct(v, p):
    v = sorted(v)
    return round(v[int(round((len(v) - 1) * p))], 1)


b = http.client.HTTPConnection("127.0.0.1", 9200, timeout=60)
for i in range(20):  # warm up both paths
    timed(b, "POST", "/v1/invoke", json.dumps({"seq": 100000 + i, "tool": "noop", "args": {}}))
    timed(b, "GET", "/v1/ping")
new = [timed(b, "POST", "/v1/invoke", json.dumps({"seq": s, "tool": "noop", "args": {}})) for s in range(1, N + 1)]
rep = [timed(b, "POST", "/v1/invoke", json.dumps({"seq": 1, "tool": "noop", "args": {}})) for _ in range(N)]
base = [timed(b, "GET", "/v1/ping") for _ in range(N)]
out = {k: {"p50": pct(v, 0.5), "p99": pct(v, 0.99)} for k, v in (("new", new), ("repeat", rep), ("baseline", base))}
print("BENCH " + json.dumps(out), flush=True)
