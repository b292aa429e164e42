"""Small servers run inside sandboxes (the template has only Python's
standard library) and a minimal WebSocket client for the tests, plus the
host-side helpers the port relay tests share."""

import base64
import hashlib
import json
import os
import socket
import struct
import time

# An HTTP server that tells what it got: method, path, headers, body size
# and digest. /big/N answers N bytes; /redirect answers a path-absolute
# redirect and a cookie for Path=/; /sw.js a service worker script that
# asks for scope / (Service-Worker-Allowed).
HTTP_ECHO = r'''
import hashlib, json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CHUNK = bytes(range(256)) * 256

class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body are separate writes: without this, Nagle and delayed
    # ACKs add 40 ms to every small answer on a real TCP stack.
    disable_nagle_algorithm = True
    def log_message(self, *a):
        pass
    def _send(self, code, body, ctype="application/json", extra=()):
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in extra:
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
    def _any(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        if self.path.startswith("/big/"):
            size = int(self.path.split("/")[2])
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(size))
            self.end_headers()
            left = size
            while left:
                k = min(left, len(CHUNK))
                self.wfile.write(CHUNK[:k])
                left -= k
            return
        if self.path.startswith("/redirect"):
            return self._send(302, b"", extra=[("Location", "/landed?x=1"), ("Set-Cookie", "k=v; Path=/; HttpOnly")])
        if self.path.startswith("/sw.js"):
            return self._send(200, b"self.onfetch = () => {};", "text/javascript", extra=[("Service-Worker-Allowed", "/")])
        out = {"method": self.command, "path": self.path,
               "headers": [[k, v] for k, v in self.headers.items()],
               "body_len": len(body), "body_sha256": hashlib.sha256(body).hexdigest()}
        self._send(200, json.dumps(out).encode())
    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_HEAD = _any

ThreadingHTTPServer.daemon_threads = True
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
'''

# A WebSocket echo server: asyncio and a hand-made RFC 6455 handshake.
# The first message it sends is the request path it saw.
WS_ECHO = r'''
import asyncio, base64, hashlib, struct, sys
GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

def frame(op, data):
    n = len(data)
    if n < 126:
        head = bytes([0x80 | op, n])
    elif n < 65536:
        head = bytes([0x80 | op, 126]) + struct.pack(">H", n)
    else:
        head = bytes([0x80 | op, 127]) + struct.pack(">Q", n)
    return head + data

def unmask(data, mask):
    n = len(data)
    if not n:
        return data
    m = (mask * (n // 4 + 1))[:n]
    return (int.from_bytes(data, "big") ^ int.from_bytes(m, "big")).to_bytes(n, "big")

async def handle(r, w):
    try:
        head = await r.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        hdrs = {}
        for l in lines[1:]:
            if ":" in l:
                k, v = l.split(":", 1)
                hdrs[k.strip().lower()] = v.strip()
        key = hdrs.get("sec-websocket-key")
        if not key or hdrs.get("upgrade", "").lower() != "websocket":
            w.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            await w.drain()
            w.close()
            return
        accept = base64.b64encode(hashlib.sha1((key + GUID).encode()).digest()).decode()
        w.write(("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                 "Sec-WebSocket-Accept: %s\r\n\r\n" % accept).encode())
        w.write(frame(1, lines[0].split(" ")[1].encode()))
        await w.drain()
        while True:
            b0, b1 = await r.readexactly(2)
            op, n = b0 & 0x0F, b1 & 0x7F
            if n == 126:
                n = struct.unpack(">H", await r.readexactly(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", await r.readexactly(8))[0]
            mask = await r.readexactly(4) if b1 & 0x80 else b"\0\0\0\0"
            data = unmask(await r.readexactly(n), mask)
            if op == 8:
                w.write(frame(8, data[:2]))
                await w.drain()
                break
            w.write(frame(10 if op == 9 else op, data))
            await w.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        w.close()

async def main():
    srv = await asyncio.start_server(handle, "127.0.0.1", int(sys.argv[1]))
    await srv.serve_forever()

asyncio.run(main())
'''


def start_guest_server(d, sid, name, source, port):
    """Writes `source` to the sandbox and starts it in the background on
    `port`; waits until it accepts."""
    assert d.put_file(sid, f"/srv/{name}.py", source.encode()).status == 204
    d.exec(sid, f"cd /srv && nohup python3 /srv/{name}.py {port} >/tmp/{name}.log 2>&1 &")
    r = d.exec(sid, argv=["python3", "-c", WAIT_PORT, str(port)], timeout_seconds=30)
    assert r["exit_code"] == 0, r


WAIT_PORT = r'''
import socket, sys, time
end = time.time() + 20
while True:
    try:
        socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=1).close()
        break
    except OSError:
        if time.time() > end:
            sys.exit(1)
        time.sleep(0.05)
'''


def _mask(data, mask):
    n = len(data)
    if not n:
        return data
    m = (mask * (n // 4 + 1))[:n]
    return (int.from_bytes(data, "big") ^ int.from_bytes(m, "big")).to_bytes(n, "big")


class WS:
    """A minimal RFC 6455 client over a plain socket: handshake (checking
    Sec-WebSocket-Accept), masked sends, whole-message receives."""

    def __init__(self, port, path, headers=None, timeout=30):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self.sock.sendall((f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
                           f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
                           f"{extra}\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(1)
            if not chunk:
                raise ConnectionError(f"handshake: closed after {head!r}")
            head += chunk
        self.status = int(head.split(b" ", 2)[1])
        self.head = head.decode("latin-1")
        if self.status == 101:
            want = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest())
            got = [l.split(":", 1)[1].strip() for l in self.head.split("\r\n")
                   if l.lower().startswith("sec-websocket-accept:")]
            assert got == [want.decode()], self.head

    def _read(self, n):
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(min(n - len(buf), 1 << 20))
            if not chunk:
                raise ConnectionError("websocket closed")
            buf += chunk
        return bytes(buf)

    def send(self, data, opcode=None):
        if isinstance(data, str):
            data, op = data.encode(), 1
        else:
            op = 2
        op = opcode or op
        n = len(data)
        if n < 126:
            head = bytes([0x80 | op, 0x80 | n])
        elif n < 65536:
            head = bytes([0x80 | op, 0x80 | 126]) + struct.pack(">H", n)
        else:
            head = bytes([0x80 | op, 0x80 | 127]) + struct.pack(">Q", n)
        mask = os.urandom(4)
        self.sock.sendall(head + mask + _mask(data, mask))

    def recv(self):
        """(opcode, payload) of the next frame."""
        b0, b1 = self._read(2)
        n = b1 & 0x7F
        if n == 126:
            n = struct.unpack(">H", self._read(2))[0]
        elif n == 127:
            n = struct.unpack(">Q", self._read(8))[0]
        return b0 & 0x0F, self._read(n)

    def close(self):
        try:
            self.send(b"\x03\xe8", opcode=8)
            self.recv()
        except OSError:
            pass
        self.sock.close()


def wait_relays_closed(d, timeout=10):
    """Every relayed connection has been torn down on the host."""
    from harness import metric, wait_for
    wait_for(lambda: metric(d, 'hatchery_relay_open{kind="port"}') == 0
             and metric(d, 'hatchery_relay_open{kind="host_service"}') == 0,
             timeout=timeout, what="relayed connections to close")


def time_ms(f):
    t = time.perf_counter()
    f()
    return (time.perf_counter() - t) * 1000
