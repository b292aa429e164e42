"""Port previews: HTTP and WebSocket to servers inside a sandbox, relayed
over the agent channel (the sandbox keeps no route to the host), through
the API-key route and through signed preview URLs, in a real browser too;
bad input, tampered tokens, closed ports and the per-sandbox cap."""

import base64
import calendar
import hashlib
import http.client
import json
import os
import subprocess
import sys
import time

import pytest

from guest_servers import HTTP_ECHO, WS, WS_ECHO, start_guest_server, wait_relays_closed
from harness import KEY, metric

# One daemon for the module's tests (tests/integration/conftest.py).
SHARED_DAEMON = True

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "../playground"))


def get(d, path, **kw):
    return d.request("GET", path, **kw)


def echo(d, sid, port=8000):
    start_guest_server(d, sid, "echo", HTTP_ECHO, port)


def test_http_through_the_ports_route(daemon, sandbox):
    d, sid = daemon, sandbox
    echo(d, sid)
    base = f"/v1/sandboxes/{sid}/ports/8000"
    r = get(d, f"{base}/some/path%2Fkept?q=1&r=%20")
    assert r.status == 200, r
    seen = r.json()
    assert seen["method"] == "GET" and seen["path"] == "/some/path%2Fkept?q=1&r=%20"
    headers = {k.lower(): v for k, v in seen["headers"]}
    # The daemon's key never reaches the guest; the prefix does.
    assert "authorization" not in headers, headers
    assert headers["x-forwarded-prefix"] == base
    assert headers["host"] == f"127.0.0.1:{d.port}"
    # Without a path, and with only the slash, the guest gets /.
    assert get(d, base).json()["path"] == "/"
    assert get(d, base + "/").json()["path"] == "/"
    # Methods and bodies, several MiB each way.
    blob = os.urandom(3 << 20)
    r = d.request("PUT", f"{base}/upload", raw=blob, headers={"Content-Type": "application/octet-stream"})
    assert r.status == 200, r
    assert r.json()["body_len"] == len(blob) and r.json()["body_sha256"] == hashlib.sha256(blob).hexdigest()
    for m in ("POST", "DELETE", "PATCH", "OPTIONS"):
        assert d.request(m, f"{base}/m").json()["method"] == m
    r = d.request("HEAD", f"{base}/h")
    assert r.status == 200 and r.body == b""
    # The preview-url path itself is only claimed for POST.
    assert get(d, f"{base}/preview-url").json()["path"] == "/preview-url"
    r = get(d, f"{base}/big/{5 << 20}")
    assert r.status == 200 and len(r.body) == 5 << 20
    assert r.body[:512] == bytes(range(256)) * 2
    # Redirects and cookies stay under the prefix.
    r = get(d, f"{base}/redirect")
    assert r.status == 302 and r.headers["location"] == f"{base}/landed?x=1", r.headers
    assert r.headers["set-cookie"] == f"k=v; Path={base}/; HttpOnly"
    # This route is for programs on the API's origin: what it relays gets
    # an opaque origin should a browser ever render it, never a service
    # worker's scope, and a worker script fetch is refused.
    r = get(d, f"{base}/sw.js")
    assert r.status == 200 and r.body == b"self.onfetch = () => {};", r
    assert "service-worker-allowed" not in {k.lower() for k in r.headers}, r.headers
    assert r.headers["content-security-policy"] == "sandbox", r.headers
    r = get(d, f"{base}/sw.js", headers={"Service-Worker": "script"})
    assert r.status == 403 and r.error_code() == "service_worker_refused", r
    assert metric(d, 'hatchery_relay_connections_total{kind="port"}') >= 10
    assert metric(d, 'hatchery_relay_bytes_total{direction="from_guest",kind="port"}') >= 5 << 20
    assert metric(d, 'hatchery_relay_bytes_total{direction="to_guest",kind="port"}') >= 3 << 20
    wait_relays_closed(d)


@pytest.mark.fresh_daemon  # reads an absolute rejection counter
def test_bad_input_is_4xx_and_leaves_nothing(daemon, sandbox):
    d, sid = daemon, sandbox
    for bad in ("0", "65536", "99999", "-1", "http", "80x"):
        r = get(d, f"/v1/sandboxes/{sid}/ports/{bad}/")
        assert r.status == 400 and r.error_code() == "invalid_port", (bad, r)
        r = d.request("POST", f"/v1/sandboxes/{sid}/ports/{bad}/preview-url", {})
        assert r.status == 400 and r.error_code() == "invalid_port", (bad, r)
    # Nothing listening: 502 with a JSON error, quickly.
    t = time.time()
    r = get(d, f"/v1/sandboxes/{sid}/ports/8999/")
    assert r.status == 502 and r.error_code() == "port_closed", r
    assert "8999" in r.json()["error"]["message"]
    assert time.time() - t < 5
    r = get(d, "/v1/sandboxes/sbx_doesnotexist0000/ports/8000/")
    assert r.status == 404 and r.error_code() == "sandbox_not_found"
    assert get(d, f"/v1/sandboxes/{sid}/ports/8000/", auth=False).status == 401
    for body in ({"ttl_seconds": 0}, {"ttl_seconds": 86401}, {"ttl_seconds": -5}, {"nope": 1}):
        r = d.request("POST", f"/v1/sandboxes/{sid}/ports/8000/preview-url", body)
        assert r.status == 400, (body, r)
    r = d.request("POST", f"/v1/sandboxes/{sid}/ports/8000/preview-url", raw=b"{not json",
                  headers={"Content-Type": "application/json"})
    assert r.status == 400 and r.error_code() == "invalid_json"
    r = d.request("POST", "/v1/sandboxes/sbx_doesnotexist0000/ports/8000/preview-url", {})
    assert r.status == 404
    # The sandbox is as it was, and nothing is left open.
    assert d.exec(sid, "echo ok")["stdout"] == "ok\n"
    assert metric(d, 'hatchery_relay_rejected_total{kind="port",reason="port_closed"}') == 1
    wait_relays_closed(d)


def mint(d, sid, port, **body):
    r = d.request("POST", f"/v1/sandboxes/{sid}/ports/{port}/preview-url", body)
    assert r.status == 200, r
    return r.json()


def retoken(token, f):
    raw = bytearray(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    f(raw)
    return base64.urlsafe_b64encode(bytes(raw)).decode().rstrip("=")


def test_preview_urls_grant_one_port_until_expiry(daemon):
    d = daemon
    sid, other = d.create(ttl_seconds=300), d.create(ttl_seconds=300)
    echo(d, sid)
    echo(d, other)
    start_guest_server(d, sid, "echo2", HTTP_ECHO, 8001)
    p = mint(d, sid, 8000, ttl_seconds=120)
    assert p["sandbox_id"] == sid and p["port"] == 8000
    # On the preview listener, not the API's origin.
    assert p["url"] == f"http://127.0.0.1:{d.preview_port}{p['path']}"
    exp = calendar.timegm(time.strptime(p["expires_at"], "%Y-%m-%dT%H:%M:%SZ"))
    assert 100 < exp - time.time() <= 121
    assert p["path"].startswith("/preview/") and p["path"].endswith("/")
    token = p["path"].split("/")[2]
    # No key needed; the guest sees the path after the token.
    r = d.preview("GET", p["path"] + "a/b?c=d")
    assert r.status == 200 and r.json()["path"] == "/a/b?c=d", r
    headers = {k.lower(): v for k, v in r.json()["headers"]}
    assert headers["x-forwarded-prefix"] == f"/preview/{token}"
    # The daemon's key sent here too is not passed on; another Authorization is;
    # a client's X-Hatchery-Daemon-Key never is.
    r = d.preview("GET", p["path"] + "x", auth=True, headers={"X-Hatchery-Daemon-Key": "hxd_guess"})
    assert not {"authorization", "x-hatchery-daemon-key"} & {k.lower() for k, _ in r.json()["headers"]}, r
    r = d.preview("GET", p["path"] + "x", headers={"Authorization": "Basic dTpw"})
    assert ["authorization", "Basic dTpw"] in r.json()["headers"]
    # Without the trailing slash: a redirect to it, query kept.
    r = d.preview("GET", f"/preview/{token}?z=1")
    assert r.status == 308 and r.headers["location"] == f"/preview/{token}/?z=1"
    r = d.preview("GET", p["path"] + "redirect")
    assert r.headers["location"] == f"/preview/{token}/landed?x=1"
    # A guest's service worker: its script is refused, its scope header dropped.
    r = d.preview("GET", p["path"] + "sw.js")
    assert r.status == 200 and "service-worker-allowed" not in {k.lower() for k in r.headers}, r.headers
    r = d.preview("GET", p["path"] + "sw.js", headers={"Service-Worker": "script"})
    assert r.status == 403 and r.error_code() == "service_worker_refused", r
    # The API's origin serves no preview: it sends the browser to the
    # preview origin (the guest never sees the request), and the preview
    # origin serves nothing of the API or Hatchery's pages.
    before = metric(d, 'hatchery_relay_connections_total{kind="port"}')
    r = get(d, p["path"] + "a?b=1", auth=False)
    assert r.status == 308 and r.error_code() == "preview_elsewhere", r
    assert r.headers["location"] == f"http://127.0.0.1:{d.preview_port}{p['path']}a?b=1"
    assert metric(d, 'hatchery_relay_connections_total{kind="port"}') == before
    r = get(d, p["path"], auth=False, headers={"X-Hatchery-Daemon-Key": "hxd_guess"})
    assert r.status == 308, r
    for path in ("/v1/sandboxes", "/healthz", "/rounds/review/", "/terminal/", "/metrics", "/openapi.json"):
        r = d.preview("GET", path, auth=True)
        assert r.status == 404 and r.error_code() == "not_found", (path, r)

    # Tampered: any flipped bit, another port, another sandbox (existing or
    # not), a longer expiry, garbage. All 403, all the same answer.
    forged = [
        retoken(token, lambda raw: raw.__setitem__(-1, raw[-1] ^ 1)),
        retoken(token, lambda raw: raw.__setitem__(slice(1, 3), (8001).to_bytes(2, "big"))),
        retoken(token, lambda raw: raw.__setitem__(slice(11, 31), other.encode())),
        retoken(token, lambda raw: raw.__setitem__(slice(11, 31), b"sbx_doesnotexist0000")),
        retoken(token, lambda raw: raw.__setitem__(slice(3, 11), (2 ** 40).to_bytes(8, "big"))),
        token[:-3], token + "A", "x", "%00", "a" * 300,
    ]
    bodies = set()
    for t in forged:
        r = d.preview("GET", f"/preview/{t}/")
        assert r.status == 403 and r.error_code() == "preview_denied", (t, r)
        bodies.add(r.body)
    assert len(bodies) == 1, bodies
    # A token for this sandbox's other port does not open this one, and vice versa.
    p2 = mint(d, sid, 8001)
    assert p2["path"] != p["path"]
    assert d.preview("GET", p2["path"]).status == 200

    # Expired.
    short = mint(d, sid, 8000, ttl_seconds=1)
    assert d.preview("GET", short["path"]).status == 200
    time.sleep(2.1)
    r = d.preview("GET", short["path"])
    assert r.status == 403 and r.error_code() == "preview_denied" and "expired" in r.json()["error"]["message"]
    # Default TTL is an hour.
    dflt = d.request("POST", f"/v1/sandboxes/{sid}/ports/8000/preview-url", raw=b"").json()
    exp = calendar.timegm(time.strptime(dflt["expires_at"], "%Y-%m-%dT%H:%M:%SZ"))
    assert 3590 < exp - time.time() <= 3601
    # The sandbox gone: the (valid) token says so.
    d.delete(sid)
    r = d.preview("GET", p["path"])
    assert r.status == 404 and r.error_code() == "sandbox_not_found", r
    wait_relays_closed(d)


@pytest.mark.fresh_daemon  # restarts the daemon on its key
def test_preview_key_is_per_daemon_0600_and_kept(daemon, sandbox):
    path = os.path.join(daemon.data_dir, "preview_key")
    assert os.stat(path).st_mode & 0o777 == 0o600
    key = open(path).read()
    assert len(key) == 64
    assert mint(daemon, sandbox, 8000)["path"]
    assert open(path).read() == key


PAGE = b"""<!doctype html><html><head><meta charset="utf-8"><title>preview</title>
<link rel="stylesheet" href="style.css"></head>
<body><h1>from the sandbox</h1><div id="out">loading</div><img id="img" src="img/dot.svg">
<script src="app.js"></script></body></html>"""
APP = b"""fetch('data/second.txt').then(r => r.text()).then(t => {
  document.getElementById('out').textContent = t.trim();
  document.body.setAttribute('data-done', '1');
});"""
DOT = b'<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"><rect width="10" height="10"/></svg>'


def test_browser_opens_a_preview_with_relative_links(daemon, sandbox):
    import cdp
    if "--disable-quic" not in cdp.CHROMIUM_FLAGS:
        cdp.CHROMIUM_FLAGS.append("--disable-quic")
    d, sid = daemon, sandbox
    for path, data in (("/site/index.html", PAGE), ("/site/app.js", APP), ("/site/style.css", b"h1 {color: rgb(1, 2, 3)}"),
                       ("/site/data/second.txt", b"second file, served from inside the sandbox\n"),
                       ("/site/img/dot.svg", DOT), ("/site/sub/index.html", b"<p id=sub>sub page</p>")):
        assert d.put_file(sid, path, data).status == 204
    d.exec(sid, "cd /site && nohup python3 -m http.server 8000 --bind 127.0.0.1 >/dev/null 2>&1 &")
    from guest_servers import WAIT_PORT
    assert d.exec(sid, argv=["python3", "-c", WAIT_PORT, "8000"])["exit_code"] == 0
    url = mint(d, sid, 8000)["url"]
    b = cdp.Browser()
    try:
        b.goto(url)
        b.wait("document.body && document.body.getAttribute('data-done') === '1'", what="second file shown")
        assert b.eval("document.getElementById('out').textContent") == "second file, served from inside the sandbox"
        assert b.eval("getComputedStyle(document.querySelector('h1')).color") == "rgb(1, 2, 3)"
        b.wait("document.getElementById('img').complete && document.getElementById('img').naturalWidth === 10",
               what="image loaded")
        assert b.eval("location.pathname").startswith("/preview/")
        # http.server redirects /sub to /sub/ with a path-absolute Location:
        # it lands under the preview, not at the daemon's root.
        b.goto(url + "sub")
        b.wait("document.getElementById('sub') !== null", what="sub page")
        assert b.eval("location.href") == url + "sub/"
        assert not b.exceptions()
    finally:
        b.close()
    wait_relays_closed(d)


def test_websocket_echo_through_ports_and_preview(daemon, sandbox):
    d, sid = daemon, sandbox
    start_guest_server(d, sid, "ws", WS_ECHO, 8765)
    ws = WS(d.port, f"/v1/sandboxes/{sid}/ports/8765/chat?room=1", {"Authorization": f"Bearer {KEY}"})
    assert ws.status == 101, ws.head
    assert ws.recv() == (1, b"/chat?room=1")
    for msg in ("hello", "x" * 200, "é" * 5000):
        ws.send(msg)
        assert ws.recv() == (1, msg.encode())
    # Bigger than the relay window both ways, several times.
    for size in (100_000, 3 << 20):
        blob = os.urandom(size)
        ws.send(blob)
        op, got = ws.recv()
        assert op == 2 and got == blob
    ws.send(b"ping!", opcode=9)
    assert ws.recv() == (10, b"ping!")
    ws.close()
    # The same through a preview URL, without the key.
    path = mint(d, sid, 8765)["path"]
    ws = WS(d.preview_port, path + "p")
    assert ws.status == 101
    assert ws.recv() == (1, b"/p")
    ws.send("via preview")
    assert ws.recv() == (1, b"via preview")
    ws.close()
    # A plain GET to the WebSocket server: its own refusal comes back.
    assert d.preview("GET", path).status == 400
    wait_relays_closed(d)


@pytest.mark.fresh_daemon  # reads the open-relay gauge
def test_connections_per_sandbox_are_capped(daemon, sandbox):
    d, sid = daemon, sandbox
    start_guest_server(d, sid, "ws", WS_ECHO, 8765)
    headers = {"Authorization": f"Bearer {KEY}"}
    open_ = [WS(d.port, f"/v1/sandboxes/{sid}/ports/8765/{i}", headers) for i in range(64)]
    assert all(w.status == 101 for w in open_)
    for i, w in enumerate(open_):
        assert w.recv() == (1, f"/{i}".encode())
    assert metric(d, 'hatchery_relay_open{kind="port"}') == 64
    r = get(d, f"/v1/sandboxes/{sid}/ports/8765/")
    assert r.status == 429 and r.error_code() == "too_many_connections", r
    assert r.headers.get("retry-after") == "1"
    # Other sandboxes have their own budget; exec is unaffected.
    other = d.create(ttl_seconds=120)
    assert get(d, f"/v1/sandboxes/{other}/ports/8765/").error_code() == "port_closed"
    assert d.exec(sid, "echo still")["stdout"] == "still\n"
    # Every one still works; closing one makes room.
    open_[0].send("last")
    assert open_[0].recv() == (1, b"last")
    open_.pop(0).close()
    deadline = time.time() + 10
    while get(d, f"/v1/sandboxes/{sid}/ports/8765/").status == 429 and time.time() < deadline:
        time.sleep(0.1)
    ws = WS(d.port, f"/v1/sandboxes/{sid}/ports/8765/again", headers)
    assert ws.status == 101
    ws.close()
    for w in open_:
        w.close()
    wait_relays_closed(d)
    assert metric(d, 'hatchery_relay_rejected_total{kind="port",reason="capacity"}') >= 1


def test_relay_keeps_the_sandbox_without_a_route_to_the_host(daemon, sandbox):
    """The relay is the only way in: the input chain still drops the
    sandbox's packets to the host, and the daemon's port is unreachable
    from inside while the same daemon relays into the sandbox."""
    d, sid = daemon, sandbox
    echo(d, sid)
    assert get(d, f"/v1/sandboxes/{sid}/ports/8000/").status == 200
    table = subprocess.run(["nft", "list", "table", "inet", f"hatchery_{d.net_prefix}"],
                           capture_output=True, text=True).stdout
    chain = table.split("chain input", 1)[1].split("}", 1)[0]
    assert "drop" in chain, table
    gw = d.exec(sid, "awk 'NR>1 && $2==\"00000000\" {print $3}' /proc/net/route")["stdout"].strip()
    host = ".".join(str(b) for b in bytes.fromhex(gw)[::-1])
    probe = ("import socket,sys\ntry:\n socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2)\n"
             " print('open')\nexcept OSError as e:\n print('blocked', e)")
    r = d.exec(sid, argv=["python3", "-c", probe, host, str(d.port)])
    assert r["stdout"].startswith("blocked"), r
    wait_relays_closed(d)


def test_many_small_requests_and_a_dying_guest_server(daemon, sandbox):
    d, sid = daemon, sandbox
    echo(d, sid)
    conn = http.client.HTTPConnection("127.0.0.1", d.port, timeout=30)
    for i in range(50):
        conn.request("GET", f"/v1/sandboxes/{sid}/ports/8000/{i}", headers={"Authorization": f"Bearer {KEY}"})
        r = conn.getresponse()
        assert r.status == 200 and json.loads(r.read())["path"] == f"/{i}"
    conn.close()
    # The server dies mid-download: the caller sees a cut response, the
    # relay is torn down, and the port then reads as closed.
    conn = http.client.HTTPConnection("127.0.0.1", d.port, timeout=30)
    conn.request("GET", f"/v1/sandboxes/{sid}/ports/8000/big/{200 << 20}", headers={"Authorization": f"Bearer {KEY}"})
    r = conn.getresponse()
    assert r.status == 200
    r.read(1 << 20)
    d.exec(sid, "pkill -f 'python3 /srv/[e]cho.py'; true")
    with pytest.raises((http.client.IncompleteRead, ConnectionError, OSError)):
        while r.read(1 << 20):
            pass
        raise ConnectionError("ended early without an error")
    conn.close()
    wait_relays_closed(d)
    assert get(d, f"/v1/sandboxes/{sid}/ports/8000/").error_code() == "port_closed"
