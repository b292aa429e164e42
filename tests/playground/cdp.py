"""Drives headless Chromium over the DevTools protocol with nothing but the
standard library: a launcher and a minimal RFC 6455 WebSocket client."""

import base64
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time
import urllib.request

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-extensions", "--disable-default-apps", "--no-default-browser-check",
                  "--mute-audio", "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0"]


def chromium_binary():
    # The Debian wrapper script (/usr/bin/chromium) only adds flags; the real
    # binary is next to its libraries.
    for p in (os.environ.get("CHROMIUM_BIN"), "/usr/lib/chromium/chromium", "/usr/bin/chromium"):
        if p and os.access(p, os.X_OK):
            return p
    raise RuntimeError("chromium not found: install the Debian package `chromium` (scripts/setup-host.sh)")


class WebSocket:
    def __init__(self, url, timeout=30):
        assert url.startswith("ws://"), url
        hostport, _, path = url[5:].partition("/")
        host, _, port = hostport.partition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        req = (f"GET /{path} HTTP/1.1\r\nHost: {hostport}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
               f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n")
        self.sock.sendall(req.encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(1)
            if not chunk:
                raise ConnectionError("websocket handshake: connection closed")
            head += chunk
        status = head.split(b"\r\n", 1)[0]
        if b" 101 " not in status:
            raise ConnectionError(f"websocket handshake failed: {status!r}")

    def _read(self, n):
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("websocket closed")
            buf += chunk
        return buf

    def send(self, text, opcode=1):
        data = text.encode() if isinstance(text, str) else text
        head = bytes([0x80 | opcode])
        n = len(data)
        if n < 126:
            head += bytes([0x80 | n])
        elif n < 1 << 16:
            head += bytes([0x80 | 126]) + struct.pack(">H", n)
        else:
            head += bytes([0x80 | 127]) + struct.pack(">Q", n)
        mask = os.urandom(4)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(data))
        self.sock.sendall(head + mask + masked)

    def recv(self):
        """One whole text message (continuation frames joined; pings answered)."""
        parts = []
        while True:
            b0, b1 = self._read(2)
            opcode, fin = b0 & 0x0F, b0 & 0x80
            n = b1 & 0x7F
            if n == 126:
                n = struct.unpack(">H", self._read(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._read(8))[0]
            mask = self._read(4) if b1 & 0x80 else None
            payload = self._read(n)
            if mask:
                payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
            if opcode == 9:
                self.send(payload, opcode=10)
                continue
            if opcode == 8:
                raise ConnectionError("websocket closed by peer")
            if opcode in (0, 1, 2):
                parts.append(payload)
                if fin:
                    return b"".join(parts).decode()

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


class Browser:
    """One headless Chromium with one page, driven over CDP."""

    def __init__(self, width=1000, height=2400):
        self.profile = tempfile.mkdtemp(prefix="hxpg-chromium-", dir="/tmp")
        self.log = open(os.path.join(self.profile, "chromium.log"), "wb")
        self.proc = subprocess.Popen(
            [chromium_binary(), *CHROMIUM_FLAGS, f"--user-data-dir={self.profile}",
             f"--window-size={width},{height}", "about:blank"],
            stdout=self.log, stderr=self.log, start_new_session=True)
        port_file = os.path.join(self.profile, "DevToolsActivePort")
        deadline = time.time() + 30
        while not (os.path.exists(port_file) and open(port_file).read().count("\n") >= 1):
            if self.proc.poll() is not None or time.time() > deadline:
                raise RuntimeError("chromium did not start")
            time.sleep(0.05)
        port = int(open(port_file).read().split("\n")[0])
        pages = []
        while not pages:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
                pages = [t for t in json.load(r) if t["type"] == "page"]
            if not pages:
                time.sleep(0.05)
        self.ws = WebSocket(pages[0]["webSocketDebuggerUrl"])
        self.next_id = 0
        self.events = []
        self.call("Page.enable")
        self.call("Runtime.enable")
        self.call("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})

    def call(self, method, params=None):
        self.next_id += 1
        my = self.next_id
        self.ws.send(json.dumps({"id": my, "method": method, "params": params or {}}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == my:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            if "method" in msg:
                self.events.append(msg)

    def eval(self, expr):
        r = self.call("Runtime.evaluate", {"expression": expr, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expr}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def goto(self, url, timeout=20):
        self.call("Page.navigate", {"url": url})
        deadline = time.time() + timeout
        while self.eval("document.readyState") != "complete":
            if time.time() > deadline:
                raise AssertionError(f"{url} did not load")
            time.sleep(0.05)

    def wait(self, expr, timeout=30, what=None, interval=0.05):
        deadline = time.time() + timeout
        while time.time() < deadline:
            v = self.eval(expr)
            if v:
                return v
            time.sleep(interval)
        raise AssertionError(f"timed out waiting for {what or expr}")

    def click(self, selector):
        """A real mouse click at the element's centre."""
        box = self.eval(f"""(() => {{ const e = document.querySelector({json.dumps(selector)});
            e.scrollIntoView({{block: 'center'}}); const r = e.getBoundingClientRect();
            return [r.x + r.width / 2, r.y + r.height / 2]; }})()""")
        x, y = box
        for t in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", {"type": t, "x": x, "y": y, "button": "left", "clickCount": 1})

    def type_into(self, selector, text):
        """Focuses a textarea, selects everything in it and types `text` over it."""
        self.eval(f"(() => {{ const e = document.querySelector({json.dumps(selector)}); e.focus(); e.select(); }})()")
        self.call("Input.insertText", {"text": text})

    def screenshot(self, path):
        data = self.call("Page.captureScreenshot", {"format": "png"})["data"]
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))
        return path

    def exceptions(self):
        return [e for e in self.events if e["method"] == "Runtime.exceptionThrown"]

    def close(self):
        self.ws.close()
        # Chromium's helpers (zygote, renderers) share its process group.
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.log.close()
        # Helpers may still be flushing into the profile for a moment.
        for _ in range(20):
            shutil.rmtree(self.profile, ignore_errors=True)
            if not os.path.exists(self.profile):
                break
            time.sleep(0.1)
