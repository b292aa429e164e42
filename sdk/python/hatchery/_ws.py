"""A minimal RFC 6455 WebSocket client over a plain socket: the client
handshake (Sec-WebSocket-Key, checked Sec-WebSocket-Accept), masked client
frames, text/binary/close/ping/pong and fragmented messages."""

from __future__ import annotations

import base64
import hashlib
import os
import socket
import ssl
import struct
import threading
from typing import Dict, Optional, Tuple
from urllib.parse import urlsplit

from . import errors
from ._http import raise_for

GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
OP_CONT, OP_TEXT, OP_BINARY, OP_CLOSE, OP_PING, OP_PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA
MAX_MESSAGE = 64 << 20


class Closed(Exception):
    """The connection is closed: `code` and `reason` from the close frame."""

    def __init__(self, code: Optional[int], reason: str = ""):
        super().__init__(f"websocket closed ({code}) {reason}".strip())
        self.code = code
        self.reason = reason


def accept_for(key: str) -> str:
    return base64.b64encode(hashlib.sha1((key + GUID).encode()).digest()).decode()


def _mask(data: bytes, key: bytes) -> bytes:
    if not data:
        return data
    n = len(data)
    k = (key * (n // 4 + 1))[:n]
    return (int.from_bytes(data, "big") ^ int.from_bytes(k, "big")).to_bytes(n, "big")


class WebSocket:
    def __init__(self, sock: socket.socket, buffered: bytes = b""):
        self._sock = sock
        self._buf = bytearray(buffered)
        self._wlock = threading.Lock()
        self.closed = False
        self.close_code: Optional[int] = None
        self.close_reason = ""
        self._sent_close = False

    @classmethod
    def connect(cls, url: str, headers: Optional[Dict[str, str]] = None, timeout: Optional[float] = 30.0) -> "WebSocket":
        """`url` is http(s):// or ws(s)://. A refused upgrade raises the typed
        error of its status."""
        u = urlsplit(url)
        tls = u.scheme in ("https", "wss")
        host = u.hostname or "127.0.0.1"
        port = u.port or (443 if tls else 80)
        target = (u.path or "/") + ("?" + u.query if u.query else "")
        try:
            sock = socket.create_connection((host, port), timeout=timeout)
            if tls:
                sock = ssl.create_default_context().wrap_socket(sock, server_hostname=host)
        except OSError as e:
            raise errors.ConnectionFailed(f"websocket {host}:{port}: {e!r}") from e
        key = base64.b64encode(os.urandom(16)).decode()
        hostport = host if u.port is None else f"{host}:{port}"
        lines = [f"GET {target} HTTP/1.1", f"Host: {hostport}", "Upgrade: websocket", "Connection: Upgrade",
                 f"Sec-WebSocket-Key: {key}", "Sec-WebSocket-Version: 13"]
        lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
        try:
            sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
            buf = b""
            while b"\r\n\r\n" not in buf:
                chunk = sock.recv(65536)
                if not chunk:
                    raise errors.ConnectionFailed("websocket: connection closed during the handshake")
                buf += chunk
                if len(buf) > 1 << 20:
                    raise errors.ConnectionFailed("websocket: handshake answer too long")
            head, rest = buf.split(b"\r\n\r\n", 1)
            status_line, *hlines = head.decode("latin-1").split("\r\n")
            parts = status_line.split(" ", 2)
            status = int(parts[1])
            rh: Dict[str, str] = {}
            for line in hlines:
                k, _, v = line.partition(":")
                rh[k.strip().lower()] = v.strip()
            if status != 101:
                n = int(rh.get("content-length", "0") or 0)
                body = rest
                while len(body) < n:
                    chunk = sock.recv(65536)
                    if not chunk:
                        break
                    body += chunk
                sock.close()
                raise_for(status if status >= 400 else 502, rh, body[:n] if n else body)
                raise errors.HatcheryError(f"websocket upgrade answered {status}", status=status)
            if rh.get("upgrade", "").lower() != "websocket" or rh.get("sec-websocket-accept") != accept_for(key):
                sock.close()
                raise errors.ConnectionFailed("websocket: bad handshake answer (Upgrade/Sec-WebSocket-Accept)")
        except socket.timeout as e:
            sock.close()
            raise errors.SandboxTimeout("websocket handshake timed out") from e
        except OSError as e:
            sock.close()
            raise errors.ConnectionFailed(f"websocket: {e!r}") from e
        sock.settimeout(None)
        return cls(sock, rest)

    # Sending -------------------------------------------------------------

    def _send_frame(self, opcode: int, payload: bytes, fin: bool = True) -> None:
        head = bytearray([(0x80 if fin else 0) | opcode])
        n = len(payload)
        if n < 126:
            head.append(0x80 | n)
        elif n < 1 << 16:
            head.append(0x80 | 126)
            head += struct.pack(">H", n)
        else:
            head.append(0x80 | 127)
            head += struct.pack(">Q", n)
        key = os.urandom(4)
        head += key
        with self._wlock:
            self._sock.sendall(bytes(head) + _mask(payload, key))

    def send_binary(self, data: bytes) -> None:
        if self.closed or self._sent_close:
            raise Closed(self.close_code, self.close_reason)
        self._send_frame(OP_BINARY, data)

    def send_text(self, text: str) -> None:
        if self.closed or self._sent_close:
            raise Closed(self.close_code, self.close_reason)
        self._send_frame(OP_TEXT, text.encode("utf-8"))

    def ping(self, data: bytes = b"") -> None:
        self._send_frame(OP_PING, data)

    def close(self, code: int = 1000, reason: str = "") -> None:
        """Sends a close frame (once) and shuts the socket."""
        if not self._sent_close and not self.closed:
            self._sent_close = True
            try:
                self._send_frame(OP_CLOSE, struct.pack(">H", code) + reason.encode()[:120])
            except OSError:
                pass
        self.closed = True
        try:
            self._sock.close()
        except OSError:
            pass

    # Receiving -----------------------------------------------------------

    def _read_exact(self, n: int) -> bytes:
        while len(self._buf) < n:
            chunk = self._sock.recv(max(65536, n - len(self._buf)))
            if not chunk:
                raise Closed(self.close_code or 1006, self.close_reason or "connection dropped")
            self._buf += chunk
        out = bytes(self._buf[:n])
        del self._buf[:n]
        return out

    def _frame(self) -> Tuple[bool, int, bytes]:
        b0, b1 = self._read_exact(2)
        fin, opcode = bool(b0 & 0x80), b0 & 0x0F
        n = b1 & 0x7F
        if n == 126:
            n = struct.unpack(">H", self._read_exact(2))[0]
        elif n == 127:
            n = struct.unpack(">Q", self._read_exact(8))[0]
        if n > MAX_MESSAGE:
            raise Closed(1009, "message too big")
        key = self._read_exact(4) if b1 & 0x80 else None
        payload = self._read_exact(n)
        if key:
            payload = _mask(payload, key)
        return fin, opcode, payload

    def recv(self, timeout: Optional[float] = None) -> Tuple[str, bytes]:
        """The next message: ("text" | "binary", payload). Pings are answered
        on the way. Raises Closed once the peer closed (or the connection
        dropped), socket.timeout past `timeout`."""
        if self.closed:
            raise Closed(self.close_code, self.close_reason)
        self._sock.settimeout(timeout)
        parts: list = []
        kind: Optional[int] = None
        try:
            while True:
                fin, op, payload = self._frame()
                if op == OP_PING:
                    try:
                        self._send_frame(OP_PONG, payload)
                    except OSError:
                        pass
                    continue
                if op == OP_PONG:
                    continue
                if op == OP_CLOSE:
                    code = struct.unpack(">H", payload[:2])[0] if len(payload) >= 2 else 1005
                    self.close_code, self.close_reason = code, payload[2:].decode("utf-8", "replace")
                    if not self._sent_close:
                        self._sent_close = True
                        try:
                            self._send_frame(OP_CLOSE, payload[:2])
                        except OSError:
                            pass
                    self.closed = True
                    self._sock.close()
                    raise Closed(self.close_code, self.close_reason)
                if op in (OP_TEXT, OP_BINARY):
                    kind, parts = op, [payload]
                elif op == OP_CONT and kind is not None:
                    parts.append(payload)
                else:
                    self.close(1002, "protocol error")
                    raise Closed(1002, "protocol error")
                if fin:
                    return ("text" if kind == OP_TEXT else "binary"), b"".join(parts)
        except Closed:
            self.closed = True
            raise
        except socket.timeout:
            raise
        except OSError as e:
            self.closed = True
            if self.close_code is None:
                self.close_code = 1006
            raise Closed(self.close_code, str(e)) from e
