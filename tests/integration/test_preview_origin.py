"""Issue 31, finding 1: a sandbox's web page must not take over the
daemon's origin. A guest server serves a page that registers a service
worker for scope `/` (with `Service-Worker-Allowed: /`); opened through
its preview URL in headless Chromium, it must not control any Hatchery
page: the rounds review page and the terminal, loaded afterwards from the
daemon's origin, are Hatchery's, with no worker in between.

The same page and worker served by a plain host-side server first show
that the probe sees a takeover when there is one (the attack as it was,
with the guest's page on the origin of the pages it then controls)."""

import http.server
import json
import os
import socketserver
import sys
import threading

from guest_servers import start_guest_server, wait_relays_closed
from harness import free_port

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "../playground"))

# Registers sw.js (next to the page) for scope "/" and for its own
# directory; once one took, waits for it to be active. The outcome lands
# in body[data-result].
PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>guest page</title></head><body>
<script>
(async () => {
  const out = {};
  for (const [name, scope] of [["root", "/"], ["own", "./"]]) {
    try {
      const r = await navigator.serviceWorker.register("sw.js", {scope});
      out[name] = "registered " + r.scope;
    } catch (e) {
      out[name] = "refused: " + e.name;
    }
  }
  if (Object.values(out).some(v => v.startsWith("registered"))) await navigator.serviceWorker.ready;
  document.body.dataset.result = JSON.stringify(out);
})();
</script></body></html>"""

# Answers every request in its scope with a page of its own.
SW = """self.addEventListener("install", () => self.skipWaiting());
self.addEventListener("activate", e => e.waitUntil(self.clients.claim()));
self.addEventListener("fetch", e => e.respondWith(new Response(
  "<!doctype html><title>owned by the guest</title><p id=owned>" + e.request.url,
  {headers: {"Content-Type": "text/html"}})));"""

# The guest's server: sw.js with Service-Worker-Allowed: /, the page
# for anything else.
GUEST = r'''
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
PAGE = %r
SW = %r
class H(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def do_GET(self):
        sw = self.path.split("?")[0].endswith("/sw.js")
        body = (SW if sw else PAGE).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/javascript" if sw else "text/html")
        if sw:
            self.send_header("Service-Worker-Allowed", "/")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
''' % (PAGE, SW)

OWNED = "document.getElementById('owned') !== null"


def registrations(b):
    return b.eval("navigator.serviceWorker.getRegistrations().then(rs => rs.map(r => r.scope))")


def result(b):
    return json.loads(b.wait("document.body && document.body.dataset.result", what="the page's registrations"))


class SameOrigin(http.server.BaseHTTPRequestHandler):
    """The attack as it was: the guest's page and worker on the origin of
    the pages the victim opens later (here a stand-in for /terminal/)."""

    def log_message(self, *a):
        pass

    def do_GET(self):
        path = self.path.split("?")[0]
        if path.endswith("/sw.js"):
            body, ctype, extra = SW, "text/javascript", [("Service-Worker-Allowed", "/")]
        elif path.startswith("/guest/"):
            body, ctype, extra = PAGE, "text/html", []
        else:
            body, ctype, extra = "<!doctype html><title>Hatchery terminal</title>", "text/html", []
        data = body.encode()
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        for k, v in extra:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def test_the_probe_sees_a_takeover_on_a_shared_origin():
    import cdp
    port = free_port()
    srv = socketserver.ThreadingTCPServer(("127.0.0.1", port), SameOrigin)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    b = cdp.Browser()
    try:
        b.goto(f"http://127.0.0.1:{port}/guest/")
        r = result(b)
        assert r["root"] == f"registered http://127.0.0.1:{port}/", r
        b.goto(f"http://127.0.0.1:{port}/terminal/")
        b.wait(OWNED, what="the worker answering the later page")
        assert b.eval("document.title") == "owned by the guest"
    finally:
        b.close()
        srv.shutdown()
        srv.server_close()


def test_a_preview_cannot_install_a_worker_over_hatchery_pages(daemon, sandbox):
    import cdp
    d, sid = daemon, sandbox
    start_guest_server(d, sid, "sw", GUEST, 8000)
    r = d.request("POST", f"/v1/sandboxes/{sid}/ports/8000/preview-url", {})
    assert r.status == 200, r
    p = r.json()
    assert p["url"].startswith(f"http://127.0.0.1:{d.preview_port}/preview/"), p
    api = f"http://127.0.0.1:{d.port}"
    b = cdp.Browser()
    try:
        b.goto(p["url"])
        r = result(b)
        # Neither scope: the browser's fetch of the worker script is
        # refused (403), whatever scope the page asks for.
        assert r["root"].startswith("refused") and r["own"].startswith("refused"), r
        assert registrations(b) == []
        # The preview as it was handed out before: asked of the API's
        # origin, it is sent to the preview origin, and nothing of it runs
        # on the API's.
        b.goto(api + p["path"])
        b.wait("document.body && document.body.dataset.result", what="the redirected preview")
        assert b.eval("location.origin") == f"http://127.0.0.1:{d.preview_port}"
        # Hatchery's pages on the daemon's origin, loaded after the
        # preview: Hatchery's own, no worker controls them or is registered.
        for path, title in (("/rounds/review/?round=rnd_x#rvw_secret", "Review · Hatchery"),
                            ("/terminal/#t=secret", "Hatchery terminal")):
            b.goto(api + path)
            assert b.eval("document.title") == title
            assert not b.eval(OWNED)
            assert b.eval("navigator.serviceWorker.controller === null")
            assert registrations(b) == []
    finally:
        b.close()
    # Their headers: no opener from another origin, no framing, no sniffing.
    for path in ("/rounds/review/", "/rounds/room/", "/terminal/", "/terminal/terminal.js"):
        h = {k.lower(): v for k, v in d.request("GET", path, auth=False).headers.items()}
        assert h["cross-origin-opener-policy"] == "same-origin", (path, h)
        assert "frame-ancestors 'none'" in h["content-security-policy"], (path, h)
        assert h["x-content-type-options"] == "nosniff", (path, h)
        assert "clear-site-data" not in h, (path, h)
    wait_relays_closed(d)


def test_a_wildcard_preview_url_gives_each_port_its_own_host():
    """--preview-url http://*.preview.test:PORT: each sandbox port is served
    at PORT-ID.preview.test, and a token only under its own host name (so
    one preview cannot be loaded into another's origin)."""
    from guest_servers import HTTP_ECHO
    from harness import Daemon
    pp = free_port()
    d = Daemon(extra_args=["--pool-size", "0", "--preview-listen", f"127.0.0.1:{pp}",
                           "--preview-url", f"http://*.preview.test:{pp}"]).start()
    try:
        a, b = d.create(ttl_seconds=300), d.create(ttl_seconds=300)
        for sid in (a, b):
            start_guest_server(d, sid, "echo", HTTP_ECHO, 8000)
        pa = d.request("POST", f"/v1/sandboxes/{a}/ports/8000/preview-url", {}).json()
        pb = d.request("POST", f"/v1/sandboxes/{b}/ports/8000/preview-url", {}).json()
        host_a = f"8000-{a[4:]}.preview.test:{pp}"
        assert pa["url"] == f"http://{host_a}{pa['path']}", pa
        r = d.preview("GET", pa["path"] + "x", headers={"Host": host_a})
        assert r.status == 200 and r.json()["path"] == "/x", r
        # b's token under a's host name, a's under the bare domain, another
        # port's label, no wildcard host at all: refused before any relay.
        for path, host in ((pb["path"], host_a), (pa["path"], f"preview.test:{pp}"),
                           (pa["path"], f"8001-{a[4:]}.preview.test:{pp}"), (pa["path"], f"127.0.0.1:{pp}")):
            r = d.preview("GET", path, headers={"Host": host})
            assert r.status == 403 and r.error_code() == "preview_denied", (host, r)
        # Asked of the API's origin: sent to the preview's own host name.
        r = d.request("GET", pb["path"] + "y", auth=False)
        assert r.status == 308 and r.headers["location"] == f"http://8000-{b[4:]}.preview.test:{pp}{pb['path']}y", r
        wait_relays_closed(d)
    finally:
        d.cleanup()
