"""HTTP/1.1 over the standard library: a small pool of keep-alive
connections (thread-safe, so the async twin can run calls concurrently),
typed errors, and retries only where a retry cannot do something twice."""

from __future__ import annotations

import http.client
import json as jsonlib
import select
import socket
import threading
import time
from typing import Any, Dict, Iterator, List, Optional, Tuple
from urllib.parse import quote, urlencode, urlsplit

from . import errors

USER_AGENT = "hatchery-python/0.1.0"
MAX_RETRY_SLEEP = 10.0
# Idle connections older than this are not reused (servers commonly close
# idle keep-alive connections after 30 s or more).
MAX_IDLE_S = 20.0
_CONN_ERRORS = (ConnectionError, http.client.RemoteDisconnected, http.client.BadStatusLine,
                http.client.IncompleteRead, BrokenPipeError)


class Response:
    def __init__(self, status: int, headers: Dict[str, str], body: bytes):
        self.status = status
        self.headers = headers
        self.body = body

    def json(self) -> Any:
        try:
            return jsonlib.loads(self.body)
        except ValueError as e:
            raise errors.HatcheryError(f"answer is not valid JSON ({e}): {self.body[:200]!r}",
                                       status=self.status) from e


def _dropped(conn: http.client.HTTPConnection) -> bool:
    """True if the server closed (or wrote to) an idle connection."""
    if conn.sock is None:
        return True
    try:
        readable, _, _ = select.select([conn.sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


def _retry_after(headers: Dict[str, str]) -> Optional[float]:
    v = headers.get("retry-after")
    try:
        return float(v) if v is not None else None
    except ValueError:
        return None


def raise_for(status: int, headers: Dict[str, str], body: bytes) -> None:
    if status < 400:
        return
    code, message = None, body.decode("utf-8", "replace")[:500] or f"HTTP {status}"
    err = None
    try:
        err = jsonlib.loads(body)["error"]
        code, message = err.get("code"), err.get("message", message)
    except (ValueError, KeyError, TypeError, AttributeError):
        err = None
    raise errors.error_for(status, code, message, _retry_after(headers), detail=err)


def path(template: str, **params: str) -> str:
    """Fills `{name}` segments, escaping every value."""
    for k, v in params.items():
        template = template.replace("{" + k + "}", quote(str(v), safe=""))
    return template


def metadata_query(metadata: Optional[Dict[str, str]]) -> List[Tuple[str, str]]:
    return [(f"metadata.{k}", v) for k, v in (metadata or {}).items()]


class Transport:
    def __init__(self, url: str, api_key: Optional[str], timeout: float = 60.0, max_retries: int = 2,
                 pool_size: int = 8):
        u = urlsplit(url)
        if u.scheme not in ("http", "https"):
            raise ValueError(f"unsupported URL scheme in {url!r}")
        self.url = url
        self._https = u.scheme == "https"
        self._host = u.hostname or "127.0.0.1"
        self._port = u.port or (443 if self._https else 80)
        self._prefix = u.path.rstrip("/")
        self._key = api_key
        self.timeout = timeout
        self.max_retries = max_retries
        self._pool_size = pool_size
        self._idle: List[Tuple[http.client.HTTPConnection, float]] = []
        self._lock = threading.Lock()

    # Connections ---------------------------------------------------------

    def _new_conn(self, timeout: Optional[float]) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        return cls(self._host, self._port, timeout=timeout)

    def _checkout(self, timeout: Optional[float]) -> Tuple[http.client.HTTPConnection, bool]:
        while True:
            with self._lock:
                item = self._idle.pop() if self._idle else None
            if item is None:
                return self._new_conn(timeout), False
            conn, since = item
            # A connection the server may have closed while idle is not
            # reused: a POST sent on it could fail without a safe retry.
            if time.monotonic() - since > MAX_IDLE_S or _dropped(conn):
                conn.close()
                continue
            conn.timeout = timeout
            if conn.sock is not None:
                conn.sock.settimeout(timeout)
            return conn, True

    def _checkin(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if len(self._idle) < self._pool_size:
                self._idle.append((conn, time.monotonic()))
                return
        conn.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for c, _ in idle:
            c.close()

    # Requests ------------------------------------------------------------

    def _headers(self, extra: Optional[Dict[str, str]]) -> Dict[str, str]:
        h = {"User-Agent": USER_AGENT}
        if self._key:
            h["Authorization"] = f"Bearer {self._key}"
        h.update(extra or {})
        return h

    def _target(self, p: str, query: Any) -> str:
        target = self._prefix + p
        if query:
            target += "?" + urlencode(query)
        return target

    def _send(self, method: str, target: str, body: Optional[bytes], headers: Dict[str, str],
              timeout: Optional[float]) -> Tuple[http.client.HTTPConnection, http.client.HTTPResponse, bool]:
        conn, reused = self._checkout(timeout)
        try:
            conn.request(method, target, body=body, headers=headers)
            return conn, conn.getresponse(), reused
        except BaseException:
            conn.close()
            raise

    def request(self, method: str, p: str, *, query: Any = None, json: Any = None, data: Optional[bytes] = None,
                headers: Optional[Dict[str, str]] = None, timeout: Optional[float] = None,
                idempotent: bool = False) -> Response:
        """One call; raises the typed error for any status >= 400.

        Retried: a connection error on an idempotent call (GET, PUT, DELETE,
        PATCH of an absolute TTL), and any call answered 429 or 503 with
        Retry-After (the daemon did nothing), up to `max_retries` times."""
        h = dict(headers or {})
        if json is not None:
            data = jsonlib.dumps(json).encode()
            h["Content-Type"] = "application/json"
        hdrs = self._headers(h)
        target = self._target(p, query)
        timeout = self.timeout if timeout is None else timeout
        attempt = 0
        while True:
            try:
                conn, r, reused = self._send(method, target, data, hdrs, timeout)
                body = r.read()
            except socket.timeout as e:
                raise errors.SandboxTimeout(f"no answer within {timeout}s: {method} {p}") from e
            except _CONN_ERRORS as e:
                # Only an idempotent call may go again: a POST whose answer
                # was lost may have created something already.
                if attempt < self.max_retries and idempotent:
                    attempt += 1
                    continue
                raise errors.ConnectionFailed(f"{method} {p}: {e!r}") from e
            except OSError as e:
                raise errors.ConnectionFailed(f"{method} {p}: {e!r}") from e
            rh = {k.lower(): v for k, v in r.getheaders()}
            if r.will_close:
                conn.close()
            else:
                self._checkin(conn)
            ra = _retry_after(rh)
            if r.status in (429, 503) and ra is not None and attempt < self.max_retries:
                attempt += 1
                time.sleep(min(max(ra, 0.0), MAX_RETRY_SLEEP))
                continue
            raise_for(r.status, rh, body)
            return Response(r.status, rh, body)

    def stream(self, method: str, p: str, *, json: Any = None, query: Any = None,
               timeout: Optional[float] = None) -> "SSE":
        """Opens a server-sent event stream on its own connection (closing it
        is how a stream is cancelled, so it never goes back to the pool)."""
        h: Dict[str, str] = {"Accept": "text/event-stream"}
        data = None
        if json is not None:
            data = jsonlib.dumps(json).encode()
            h["Content-Type"] = "application/json"
        hdrs = self._headers(h)
        target = self._target(p, query)
        conn = self._new_conn(self.timeout if timeout is None else timeout)
        try:
            conn.request(method, target, body=data, headers=hdrs)
            r = conn.getresponse()
            if r.status >= 400:
                raise_for(r.status, {k.lower(): v for k, v in r.getheaders()}, r.read())
        except socket.timeout as e:
            conn.close()
            raise errors.SandboxTimeout(f"no answer: {method} {p}") from e
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            raise errors.ConnectionFailed(f"{method} {p}: {e!r}") from e
        except BaseException:
            conn.close()
            raise
        return SSE(conn, r)


class SSE:
    """Iterates (event, data) pairs; `data` is parsed JSON. Comment lines
    (keep-alives) are skipped."""

    def __init__(self, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse):
        self._conn = conn
        self._resp = resp
        self.closed = False

    def __iter__(self) -> Iterator[Tuple[str, Any]]:
        event: Optional[str] = None
        data: List[str] = []
        try:
            while True:
                line = self._resp.readline()
                if not line:
                    return
                text = line.decode("utf-8", "replace").rstrip("\r\n")
                if text.startswith(":"):
                    continue
                if text == "":
                    if event is not None or data:
                        raw = "\n".join(data)
                        try:
                            payload = jsonlib.loads(raw) if raw else None
                        except ValueError as e:
                            raise errors.StreamError(f"bad event data: {raw[:200]!r}") from e
                        yield event or "message", payload
                    event, data = None, []
                elif text.startswith("event:"):
                    event = text[6:].strip()
                elif text.startswith("data:"):
                    data.append(text[5:][1:] if text[5:].startswith(" ") else text[5:])
        except socket.timeout as e:
            raise errors.SandboxTimeout("stream stalled past the client timeout") from e
        except (OSError, http.client.HTTPException) as e:
            if self.closed:
                return
            raise errors.StreamError(f"stream broken: {e!r}") from e
        finally:
            self.close()

    def close(self) -> None:
        self.closed = True
        self._conn.close()
