"""A minimal RFC 6455 WebSocket client on the standard library, for the
terminal tests: handshake with arbitrary headers, binary and text messages,
close codes, and the HTTP answer when the server refuses the upgrade."""

import base64
import hashlib
import json
import os
import select
import socket
import struct
import time

GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


class Refused(Exception):
    """The server answered the upgrade with an ordinary HTTP response."""

    def __init__(self, status, headers, body):
        super().__init__(f"{status}: {body[:300]!r}")
        self.status = status
        self.headers = headers
        self.body = body

    def json(self):
        return json.loads(self.body)

    def error_code(self):
        return self.json()["error"]["code"]


class Closed(Exception):
    def __init__(self, code, reason):
        super().__init__(f"closed {code} {reason!r}")
        self.code = code
        self.reason = reason


class WebSocket:
    def __init__(self, port, path, headers=None, timeout=30, host="127.0.0.1"):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        h = {"Host": f"{host}:{port}", "Upgrade": "websocket", "Connection": "Upgrade",
             "Sec-WebSocket-Key": key, "Sec-WebSocket-Version": "13", **(headers or {})}
        req = f"GET {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in h.items()) + "\r\n"
        self.sock.sendall(req.encode())
        self.buf = b""
        head = self._until(b"\r\n\r\n")
        lines = head.decode(errors="replace").split("\r\n")
        status = int(lines[0].split()[1])
        resp_headers = {}
        for line in lines[1:]:
            if ":" in line:
                k, v = line.split(":", 1)
                resp_headers[k.strip().lower()] = v.strip()
        if status != 101:
            n = int(resp_headers.get("content-length", "0"))
            while len(self.buf) < n:
                chunk = self.sock.recv(65536)
                if not chunk:
                    break
                self.buf += chunk
            self.sock.close()
            raise Refused(status, resp_headers, self.buf[:n])
        accept = base64.b64encode(hashlib.sha1((key + GUID).encode()).digest()).decode()
        assert resp_headers.get("sec-websocket-accept") == accept, resp_headers
        self.close_code = None
        self.close_reason = None

    def _until(self, marker):
        while marker not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("connection closed during the handshake")
            self.buf += chunk
        head, _, self.buf = self.buf.partition(marker)
        return head

    def _read(self, n):
        while len(self.buf) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("connection closed")
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def send_frame(self, payload, opcode):
        head = bytes([0x80 | opcode])
        n = len(payload)
        if n < 126:
            head += bytes([0x80 | n])
        elif n < 1 << 16:
            head += bytes([0x80 | 126]) + struct.pack(">H", n)
        else:
            head += bytes([0x80 | 127]) + struct.pack(">Q", n)
        mask = os.urandom(4)
        # XOR with a repeated mask, fast enough for test-sized payloads.
        m = (mask * (n // 4 + 1))[:n]
        masked = (int.from_bytes(payload, "big") ^ int.from_bytes(m, "big")).to_bytes(n, "big") if n else b""
        self.sock.sendall(head + mask + masked)

    def send_bytes(self, data):
        self.send_frame(data if isinstance(data, bytes) else data.encode(), 2)

    def send_text(self, text):
        self.send_frame(text.encode(), 1)

    def send_json(self, obj):
        self.send_text(json.dumps(obj))

    def ping(self, data=b"hi"):
        self.send_frame(data, 9)

    def close(self, code=1000, reason=""):
        try:
            self.send_frame(struct.pack(">H", code) + reason.encode(), 8)
        except OSError:
            pass

    def shutdown(self):
        try:
            self.sock.close()
        except OSError:
            pass

    def recv(self, timeout=30):
        """One message: ("binary", bytes), ("text", str), or ("pong", bytes).
        Raises Closed on a close frame (after answering it)."""
        self.sock.settimeout(timeout)
        parts, kind = [], None
        while True:
            b0, b1 = self._read(2)
            opcode, fin = b0 & 0x0F, b0 & 0x80
            n = b1 & 0x7F
            if n == 126:
                n = struct.unpack(">H", self._read(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._read(8))[0]
            assert not b1 & 0x80, "server frames are never masked"
            payload = self._read(n)
            if opcode == 8:
                code = struct.unpack(">H", payload[:2])[0] if len(payload) >= 2 else 1005
                self.close_code, self.close_reason = code, payload[2:].decode(errors="replace")
                self.close(code)
                raise Closed(code, self.close_reason)
            if opcode == 9:
                self.send_frame(payload, 10)
                continue
            if opcode == 10:
                return ("pong", payload)
            if opcode in (1, 2):
                kind = "text" if opcode == 1 else "binary"
            parts.append(payload)
            if fin:
                data = b"".join(parts)
                return (kind, data.decode()) if kind == "text" else (kind, data)


class Term:
    """A terminal session over the WebSocket: keeps every byte of output
    and every control message, and waits for text to show up."""

    def __init__(self, ws):
        self.ws = ws
        self.out = b""
        self.controls = []
        self.closed = None

    def pump(self, timeout):
        """Reads what arrives within `timeout` seconds (at least one
        message if one comes). Returns False once the socket closed."""
        if self.closed:
            return False
        if not self.ws.buf:
            r, _, _ = select.select([self.ws.sock], [], [], timeout)
            if not r:
                return True
        try:
            kind, data = self.ws.recv(timeout=max(timeout, 5))
        except Closed as c:
            self.closed = (c.code, c.reason)
            return False
        except (ConnectionError, OSError):
            self.closed = (1006, "")
            return False
        if kind == "binary":
            self.out += data
        elif kind == "text":
            self.controls.append(json.loads(data))
        return True

    def text(self):
        return self.out.decode(errors="replace")

    def wait_for(self, needle, timeout=20, start=0):
        """Waits until `needle` appears in the output after offset `start`;
        returns the offset just past it."""
        needle = needle.encode() if isinstance(needle, str) else needle
        deadline = time.time() + timeout
        while True:
            at = self.out.find(needle, start)
            if at >= 0:
                return at + len(needle)
            left = deadline - time.time()
            if left <= 0 or not self.pump(min(left, 0.5)) and self.closed:
                at = self.out.find(needle, start)
                if at >= 0:
                    return at + len(needle)
                raise AssertionError(f"{needle!r} not seen (closed={self.closed}); output: {self.out[-2000:]!r}")

    def wait_control(self, type_, timeout=20):
        deadline = time.time() + timeout
        while True:
            for c in self.controls:
                if c.get("type") == type_:
                    return c
            left = deadline - time.time()
            if left <= 0 or (not self.pump(min(left, 0.5)) and self.closed):
                for c in self.controls:
                    if c.get("type") == type_:
                        return c
                raise AssertionError(f"no {type_} message (closed={self.closed}); got {self.controls}")

    def wait_closed(self, timeout=20):
        deadline = time.time() + timeout
        while not self.closed:
            left = deadline - time.time()
            if left <= 0:
                raise AssertionError(f"socket still open; controls {self.controls}")
            self.pump(min(left, 0.5))
        return self.closed

    def type(self, text):
        self.ws.send_bytes(text.encode() if isinstance(text, str) else text)

    def resize(self, cols, rows):
        self.ws.send_json({"type": "resize", "cols": cols, "rows": rows})

    def mark(self):
        return len(self.out)
