"""The synchronous API: Client, Sandbox (with .filesystem and .network),
Snapshot and Template. Every HTTP route the SDK uses is listed in ROUTES,
which tests/test_openapi.py compares with the daemon's OpenAPI document."""

from __future__ import annotations

import json as _json
import math
import queue
import socket
import threading
import time
from base64 import b64decode
import http.client as http_client
from typing import Any, Callable, Dict, Iterator, List, Literal, Optional, Tuple, Union, overload
from urllib.parse import quote, urlencode, urlsplit

from . import errors
from ._config import resolve_key, resolve_url
from ._http import SSE, Response, Transport, metadata_query, path, raise_for
from ._ws import Closed, WebSocket
from .models import (BuildAccepted, BuildEvent, CodeContext, ContextLike, CpuLimitBasis, ExecReason, ExecResult, Execution,
                     ExecutionError, FileEntry, Logs, NetworkEvent, NetworkPolicy, OutputChunk, OutputEncoding,
                     PolicyLike, PolicySummary, PreviewUrl, ProcessChunk, ProcessInfo, Result, SandboxInfo, SnapshotInfo, SnapshotPool, StoredPolicy,
                     Secret, Tenant, TenantKey, CreatedKey,
                     TemplateInfo, TerminalExit, TerminalToken, context_id, policy_dict)

# (method, path) -> what in this SDK calls it.
ROUTES = {
    ("GET", "/healthz"): "Client.health",
    ("POST", "/v1/policies"): "Policies.create",
    ("GET", "/v1/policies"): "Policies.list",
    ("GET", "/v1/policies/{id}"): "Policies.get",
    ("POST", "/v1/policies/{id}/versions"): "Policies.add_version",
    ("GET", "/v1/policies/{id}/versions/{version}"): "Policies.get_version",
    ("POST", "/v1/secrets"): "Secrets.create",
    ("GET", "/v1/secrets"): "Secrets.list",
    ("DELETE", "/v1/secrets/{name}"): "Secrets.delete",
    ("POST", "/v1/tenants"): "Tenants.create",
    ("GET", "/v1/tenants"): "Tenants.list",
    ("GET", "/v1/tenants/{id}"): "Tenants.get",
    ("PATCH", "/v1/tenants/{id}"): "Tenants.update",
    ("DELETE", "/v1/tenants/{id}"): "Tenants.delete",
    ("POST", "/v1/tenants/{id}/keys"): "Tenants.create_key",
    ("GET", "/v1/tenants/{id}/keys"): "Tenants.list_keys",
    ("DELETE", "/v1/tenants/{id}/keys/{key_id}"): "Tenants.revoke_key",
    ("GET", "/metrics"): "Client.metrics",
    ("GET", "/openapi.json"): "Client.openapi",
    ("POST", "/v1/sandboxes"): "Sandbox.create",
    ("GET", "/v1/sandboxes"): "Sandbox.list",
    ("GET", "/v1/sandboxes/{id}"): "Sandbox.get",
    ("PATCH", "/v1/sandboxes/{id}"): "Sandbox.set_ttl",
    ("DELETE", "/v1/sandboxes/{id}"): "Sandbox.kill",
    ("POST", "/v1/sandboxes/{id}/exec"): "Sandbox.exec",
    ("POST", "/v1/sandboxes/{id}/exec/stream"): "Sandbox.exec_stream",
    ("POST", "/v1/sandboxes/{id}/code"): "Sandbox.run_code",
    ("POST", "/v1/sandboxes/{id}/code/stream"): "Sandbox.run_code",
    ("POST", "/v1/sandboxes/{id}/code/contexts"): "Sandbox.create_code_context",
    ("GET", "/v1/sandboxes/{id}/code/contexts"): "Sandbox.list_code_contexts",
    ("POST", "/v1/sandboxes/{id}/code/contexts/{context_id}/restart"): "Sandbox.restart_code_context",
    ("DELETE", "/v1/sandboxes/{id}/code/contexts/{context_id}"): "Sandbox.remove_code_context",
    ("GET", "/v1/sandboxes/{id}/processes"): "Sandbox.processes",
    ("GET", "/v1/sandboxes/{id}/processes/{pid}"): "Sandbox.process",
    ("DELETE", "/v1/sandboxes/{id}/processes/{pid}"): "Process.kill",
    ("GET", "/v1/sandboxes/{id}/processes/{pid}/output"): "Process.output",
    ("POST", "/v1/sandboxes/{id}/processes/{pid}/stdin"): "Process.send_stdin",
    ("POST", "/v1/sandboxes/{id}/processes/{pid}/stdin/close"): "Process.close_stdin",
    ("POST", "/v1/sandboxes/{id}/processes/{pid}/signal"): "Process.signal",
    ("POST", "/v1/sandboxes/{id}/processes/{pid}/wait"): "Process.wait",
    ("PUT", "/v1/sandboxes/{id}/files"): "Filesystem.write",
    ("GET", "/v1/sandboxes/{id}/files"): "Filesystem.read",
    ("DELETE", "/v1/sandboxes/{id}/files"): "Filesystem.remove",
    ("GET", "/v1/sandboxes/{id}/files/list"): "Filesystem.list",
    ("GET", "/v1/sandboxes/{id}/network"): "Network.get",
    ("PUT", "/v1/sandboxes/{id}/network"): "Network.update",
    ("GET", "/v1/sandboxes/{id}/network/events"): "Network.events",
    ("GET", "/v1/sandboxes/{id}/ports/{port}/{path}"): "Sandbox.port_request",
    ("PUT", "/v1/sandboxes/{id}/ports/{port}/{path}"): "Sandbox.port_request",
    ("POST", "/v1/sandboxes/{id}/ports/{port}/{path}"): "Sandbox.port_request",
    ("DELETE", "/v1/sandboxes/{id}/ports/{port}/{path}"): "Sandbox.port_request",
    ("PATCH", "/v1/sandboxes/{id}/ports/{port}/{path}"): "Sandbox.port_request",
    ("HEAD", "/v1/sandboxes/{id}/ports/{port}/{path}"): "Sandbox.port_request",
    ("OPTIONS", "/v1/sandboxes/{id}/ports/{port}/{path}"): "Sandbox.port_request",
    ("POST", "/v1/sandboxes/{id}/ports/{port}/preview-url"): "Sandbox.preview_url",
    ("GET", "/preview/{token}/{path}"): "Client.preview_request",
    ("PUT", "/preview/{token}/{path}"): "Client.preview_request",
    ("POST", "/preview/{token}/{path}"): "Client.preview_request",
    ("DELETE", "/preview/{token}/{path}"): "Client.preview_request",
    ("PATCH", "/preview/{token}/{path}"): "Client.preview_request",
    ("HEAD", "/preview/{token}/{path}"): "Client.preview_request",
    ("OPTIONS", "/preview/{token}/{path}"): "Client.preview_request",
    ("GET", "/v1/sandboxes/{id}/pty"): "Sandbox.pty",
    ("POST", "/v1/sandboxes/{id}/pty/token"): "Sandbox.pty_token",
    ("POST", "/v1/sandboxes/{id}/snapshots"): "Sandbox.snapshot",
    ("GET", "/v1/snapshots"): "Snapshot.list",
    ("GET", "/v1/snapshots/{id}"): "Snapshot.get",
    ("DELETE", "/v1/snapshots/{id}"): "Snapshot.delete",
    ("POST", "/v1/snapshots/{id}/fork"): "Snapshot.fork",
    ("GET", "/v1/snapshots/{id}/pool"): "Snapshot.pool",
    ("PUT", "/v1/snapshots/{id}/pool"): "Snapshot.set_pool",
    ("GET", "/v1/templates"): "Template.list",
    ("POST", "/v1/templates"): "Template.build",
    ("GET", "/v1/templates/{name}"): "Template.get",
    ("DELETE", "/v1/templates/{name}"): "Template.delete",
    ("GET", "/v1/templates/{name}/builds/{id}/events"): "Template.build_events",
}

# Exec calls wait for the command; the HTTP timeout trails its deadline by
# the daemon's own grace (kill 1 s after, give up 3 s after that) plus slack.
EXEC_GRACE_S = 15.0
DEFAULT_EXEC_TIMEOUT_S = 60
DEFAULT_CODE_TIMEOUT_S = 30
# The daemon sends a keep-alive comment every 15 s on a silent stream, so a
# read timeout longer than that means a dead stream.
STREAM_IDLE_S = 45.0
# The longest wait the daemon accepts for a background process (seconds).
MAX_WAIT_S = 300


def _drop_none(d: Dict[str, Any]) -> Dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


class Client:
    """Connection settings plus a pool of keep-alive connections.

    url: argument, else HATCHERY_URL, else http://127.0.0.1:7423.
    api_key: argument, else HATCHERY_API_KEY, else (for a daemon on this
    machine) the key file /var/lib/hatchery/api_key (HATCHERY_KEY_FILE)."""

    def __init__(self, url: Optional[str] = None, api_key: Optional[str] = None, *, timeout: float = 60.0,
                 max_retries: int = 2, key_file: Optional[str] = None):
        self.url = resolve_url(url)
        self.transport = Transport(self.url, resolve_key(api_key, self.url, key_file), timeout=timeout,
                                   max_retries=max_retries)

    def call(self, method: str, route: str, *, params: Optional[Dict[str, str]] = None, **kw: Any) -> Response:
        assert (method, route) in ROUTES, (method, route)
        if method in ("GET", "PUT", "DELETE", "PATCH"):
            kw.setdefault("idempotent", True)
        return self.transport.request(method, path(route, **(params or {})), **kw)

    def stream(self, method: str, route: str, *, params: Optional[Dict[str, str]] = None, **kw: Any) -> SSE:
        assert (method, route) in ROUTES, (method, route)
        return self.transport.stream(method, path(route, **(params or {})), **kw)

    def health(self) -> Dict[str, Any]:
        h: Dict[str, Any] = self.call("GET", "/healthz").json()
        return h

    def metrics(self) -> str:
        return self.call("GET", "/metrics").body.decode()

    def openapi(self) -> Dict[str, Any]:
        doc: Dict[str, Any] = self.call("GET", "/openapi.json").json()
        return doc

    def raw(self, method: str, target: str, *, body: Optional[Union[str, bytes]] = None,
            headers: Optional[Dict[str, str]] = None, auth: bool = True,
            timeout: Optional[float] = None) -> Tuple[int, Dict[str, str], bytes]:
        """One request to `target` (a path under the daemon's URL, sent as
        is), on its own connection; any status comes back, not raised."""
        t = self.transport
        if isinstance(body, str):
            body = body.encode("utf-8")
        h = t._headers(headers) if auth else {"User-Agent": t._headers(None)["User-Agent"], **(headers or {})}
        conn = t._new_conn(t.timeout if timeout is None else timeout)
        return _exchange(conn, method, t._prefix + target, body, h, target)

    def preview_request(self, url: Union[str, PreviewUrl], method: str = "GET", path: str = "/", body: Optional[Union[str, bytes]] = None,
                        headers: Optional[Dict[str, str]] = None) -> Tuple[int, Dict[str, str], bytes]:
        """Fetches `path` under a preview URL (a `PreviewUrl` or its `url`)
        without the API key, as a browser would: (status, headers, body).
        Previews are served on the daemon's preview origin, not the API's;
        a bare `/preview/...` path is asked of the daemon, which names the
        preview origin in a 308 that this follows once."""
        if isinstance(url, PreviewUrl):
            url = url.url
        parts = urlsplit(url)
        assert "/preview/" in parts.path, url
        if not parts.netloc:
            p = parts.path
            prefix = self.transport._prefix
            if prefix and p.startswith(prefix + "/"):
                p = p[len(prefix):]
            target = p.rstrip("/") + "/" + path.lstrip("/")
            status, h, data = self.raw(method, target, body=body, headers=headers, auth=False)
            if status != 308 or "location" not in h:
                return status, h, data
            url, path = h["location"], ""
            parts = urlsplit(url)
        target = parts.path.rstrip("/") + "/" + path.lstrip("/") if path else parts.path
        if parts.query:
            target += "?" + parts.query
        return self._fetch(method, parts.scheme, parts.netloc, target, body, headers)

    def _fetch(self, method: str, scheme: str, netloc: str, target: str, body: Optional[Union[str, bytes]],
               headers: Optional[Dict[str, str]]) -> Tuple[int, Dict[str, str], bytes]:
        """One request without the key to another origin (the preview one)."""
        if isinstance(body, str):
            body = body.encode("utf-8")
        cls = http_client.HTTPSConnection if scheme == "https" else http_client.HTTPConnection
        conn = cls(netloc, timeout=self.transport.timeout)
        h = {"User-Agent": self.transport._headers(None)["User-Agent"], **(headers or {})}
        return _exchange(conn, method, target, body, h, netloc + target)

    def close(self) -> None:
        self.transport.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


_default: Optional[Client] = None
_default_lock = threading.Lock()


def default_client() -> Client:
    """Built from the environment on first use; `configure` replaces it."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Client()
        return _default


def configure(url: Optional[str] = None, api_key: Optional[str] = None, **kw: Any) -> Client:
    global _default
    with _default_lock:
        if _default is not None:
            _default.close()
        _default = Client(url, api_key, **kw)
        return _default


def _exec_body(cmd: Optional[str], argv: Optional[List[str]], timeout_seconds: Optional[int], cwd: Optional[str],
               env: Optional[Dict[str, str]], stdin: Optional[Union[str, bytes]],
               max_output_bytes: Optional[int], cpu_limit_ms: Optional[int], output: Optional[str] = None,
               background: bool = False, cpu_limit_basis: Optional[CpuLimitBasis] = None) -> Dict[str, Any]:
    if (cmd is None) == (argv is None):
        raise ValueError("give exactly one of cmd and argv")
    if output not in (None, "text", "base64"):
        raise ValueError(f"output must be 'text' or 'base64', not {output!r}")
    if isinstance(stdin, bytes):
        stdin = stdin.decode("utf-8")
    body = _drop_none({"cmd": cmd, "argv": argv, "timeout_seconds": timeout_seconds, "cwd": cwd, "env": env,
                     "stdin": stdin, "max_output_bytes": max_output_bytes, "cpu_limit_ms": cpu_limit_ms,
                     "cpu_limit_basis": cpu_limit_basis})
    if output == "base64":
        body["output"] = output
    if background:
        body["background"] = True
    return body


def _http_timeout(timeout_seconds: Optional[int], default: int = DEFAULT_EXEC_TIMEOUT_S) -> float:
    return (timeout_seconds or default) + EXEC_GRACE_S


def _whole_seconds(timeout: Optional[float]) -> Optional[int]:
    """The API counts whole seconds: a fraction rounds up."""
    return None if timeout is None else int(math.ceil(timeout))


class _CodeEvents:
    """Folds the events of a streamed code run into an Execution, calling
    the callbacks as they arrive."""

    def __init__(self, on_stdout: Optional[Callable[[str], Any]], on_stderr: Optional[Callable[[str], Any]],
                 on_result: Optional[Callable[[Result], Any]], on_error: Optional[Callable[[ExecutionError], Any]]):
        self.on_stdout, self.on_stderr, self.on_result, self.on_error = on_stdout, on_stderr, on_result, on_error
        self.logs = Logs()
        self.results: List[Result] = []
        self.error: Optional[ExecutionError] = None

    def feed(self, kind: str, data: Any) -> Optional[Execution]:
        """One event; the Execution once the run is done."""
        if kind in ("stdout", "stderr"):
            chunk = data["data"]
            getattr(self.logs, kind).append(chunk)
            cb = self.on_stdout if kind == "stdout" else self.on_stderr
            if cb is not None:
                cb(chunk)
        elif kind == "result":
            r = Result.from_dict(data)
            self.results.append(r)
            if self.on_result is not None:
                self.on_result(r)
        elif kind == "error":
            self.error = ExecutionError.from_dict(data)
            if self.on_error is not None:
                self.on_error(self.error)
        elif kind == "done":
            ex = Execution.from_summary(data, self.results, self.logs, self.error)
            if ex.error is not None and self.error is None and self.on_error is not None:
                self.on_error(ex.error)
            return ex
        elif kind == "failed":
            raise errors.error_from_event(data)
        return None


class ExecStream:
    """Output of a running command, as it comes. Iterate it for
    `OutputChunk`s, or call `wait()`; either way `result` ends up holding the
    `ExecResult` (with the whole stdout/stderr collected). Closing it early
    (or leaving a `with` block) kills the command. A stream that ends
    without an exit event raises `StreamError`."""

    def __init__(self, sse: SSE, on_stdout: Optional[Callable[[Any], None]] = None,
                 on_stderr: Optional[Callable[[Any], None]] = None, output: Optional[str] = None):
        self._sse = sse
        self._events = iter(sse)
        self._cb = {"stdout": on_stdout, "stderr": on_stderr}
        self._raw = output == "base64"
        self._out: Dict[str, List[Any]] = {"stdout": [], "stderr": []}
        self.result: Optional[ExecResult] = None

    def __iter__(self) -> Iterator[OutputChunk]:
        return self

    def __next__(self) -> OutputChunk:
        if self.result is not None:
            raise StopIteration
        for kind, data in self._events:
            if kind in ("stdout", "stderr"):
                chunk: Union[str, bytes] = b64decode(data["data"]) if self._raw else data["data"]
                self._out[kind].append(chunk)
                cb = self._cb[kind]
                if cb is not None:
                    cb(chunk)
                return OutputChunk(kind, chunk)
            if kind == "exit":
                if self._raw:
                    # The output came as events; the exit's own is empty.
                    res = ExecResult.from_dict(data, "base64")
                    raw = {k: b"".join(self._out[k]) + res._bytes(k) for k in ("stdout", "stderr")}
                    setattr(res, "_raw", raw)
                    res.stdout = raw["stdout"].decode("utf-8", "replace")
                    res.stderr = raw["stderr"].decode("utf-8", "replace")
                else:
                    res = ExecResult.from_dict(data)
                    res.stdout = "".join(self._out["stdout"]) + res.stdout
                    res.stderr = "".join(self._out["stderr"]) + res.stderr
                self.result = res
                self._sse.close()
                raise StopIteration
            if kind == "error":
                self._sse.close()
                raise errors.error_from_event(data)
        raise errors.StreamError("exec stream ended without an exit event")

    def wait(self) -> ExecResult:
        for _ in self:
            pass
        assert self.result is not None
        return self.result

    def close(self) -> None:
        self._sse.close()

    def __enter__(self) -> "ExecStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Filesystem:
    """Files inside one sandbox; paths are absolute."""

    def __init__(self, sandbox: "Sandbox"):
        self._s = sandbox

    def _call(self, method: str, route: str, p: str, **kw: Any) -> Response:
        return self._s._client.call(method, route, params={"id": self._s.id}, query={"path": p}, **kw)

    def write(self, path: str, data: Union[str, bytes]) -> None:
        """Creates or truncates the file (mode 0644); missing parent
        directories are created."""
        if isinstance(data, str):
            data = data.encode("utf-8")
        self._call("PUT", "/v1/sandboxes/{id}/files", path, data=data,
                   headers={"Content-Type": "application/octet-stream"})

    def read(self, path: str) -> bytes:
        return self._call("GET", "/v1/sandboxes/{id}/files", path).body

    def read_text(self, path: str, encoding: str = "utf-8") -> str:
        return self.read(path).decode(encoding)

    def list(self, path: str = "/") -> List[FileEntry]:
        r = self._call("GET", "/v1/sandboxes/{id}/files/list", path).json()
        return [FileEntry.from_dict(e) for e in r["entries"]]

    def remove(self, path: str) -> None:
        """A file, a symlink, or a directory with everything in it."""
        self._call("DELETE", "/v1/sandboxes/{id}/files", path)

    def exists(self, path: str) -> bool:
        if path == "/":
            return True
        parent, _, name = path.rstrip("/").rpartition("/")
        try:
            return any(e.name == name for e in self.list(parent or "/"))
        except (errors.NotFound, errors.Conflict):
            return False


class Network:
    """The sandbox's egress policy and its log of denied connections."""

    def __init__(self, sandbox: "Sandbox"):
        self._s = sandbox

    def get(self) -> NetworkPolicy:
        r = self._s._client.call("GET", "/v1/sandboxes/{id}/network", params={"id": self._s.id})
        return NetworkPolicy.from_dict(r.json())

    def update(self, policy: PolicyLike) -> NetworkPolicy:
        r = self._s._client.call("PUT", "/v1/sandboxes/{id}/network", params={"id": self._s.id},
                                 json=policy_dict(policy))
        return NetworkPolicy.from_dict(r.json())

    def events(self) -> List[NetworkEvent]:
        """Denied attempts as the kernel logged them (rate-limited), oldest first."""
        r = self._s._client.call("GET", "/v1/sandboxes/{id}/network/events", params={"id": self._s.id})
        return [NetworkEvent.from_dict(e) for e in r.json()["events"]]

    def denied_total(self) -> Optional[int]:
        """Every new connection the policy refused, logged or not (exact);
        None when the daemon does not count."""
        r = self._s._client.call("GET", "/v1/sandboxes/{id}/network/events", params={"id": self._s.id})
        return r.json().get("denied_total")


class ProcessOutput:
    """The output of a background process from some offset: iterate it for
    `ProcessChunk`s. Following (the default), it ends when the process
    exits; otherwise once the output so far is read. Either way `info` then
    holds the process's `ProcessInfo` (its final one if it exited; the
    Process is updated too) and `next_offset` where to resume. Closing it
    (or leaving a `with` block) stops reading, not the process. A stream
    that ends without its final event raises `StreamError`."""

    def __init__(self, sse: SSE, offset: int, encoding: str, process: Optional["Process"] = None):
        self._sse = sse
        self._process = process
        self._events = iter(sse)
        self._raw = encoding == "base64"
        self.next_offset = offset
        self.info: Optional[ProcessInfo] = None

    @property
    def exited(self) -> bool:
        """The stream ended with the process's exit (not just the output so
        far, with follow=False)."""
        return self.info is not None and not self.info.running

    def __iter__(self) -> Iterator[ProcessChunk]:
        return self

    def __next__(self) -> ProcessChunk:
        if self.info is not None:
            raise StopIteration
        for kind, data in self._events:
            if kind in ("stdout", "stderr"):
                chunk = ProcessChunk(kind, b64decode(data["data"]) if self._raw else data["data"], data["offset"])
                self.next_offset = max(self.next_offset, chunk.end_offset)
                return chunk
            if kind in ("exit", "end"):
                self.info = ProcessInfo.from_dict(data)
                if self._process is not None:
                    self._process.info = self.info
                self._sse.close()
                raise StopIteration
            if kind == "error":
                self._sse.close()
                raise errors.error_from_event(data)
        raise errors.StreamError("process output ended without an exit or end event")

    def close(self) -> None:
        self._sse.close()

    def __enter__(self) -> "ProcessOutput":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Process:
    """A background process (``sbx.exec(..., background=True)``,
    ``sbx.processes()``, ``sbx.process(id)``). Its fields are those of `info`
    (ProcessInfo), as of the last call that returned it (`refresh`, `wait`,
    `kill`, `signal`, the end of an `output`): `id` (``proc_...``,
    what `Sandbox.process` takes back), `pid` (inside the sandbox), `argv`,
    `state`, `exit_code`, `reason`, `cpu_ms`, `output_bytes`,
    `first_offset`, `stdin_open`, `started_at`; the signal that ended it is
    ``info.signal`` (`signal` is the method that sends one). Iterating a
    Process follows its output from the start."""

    def __init__(self, info: ProcessInfo, sandbox: "Sandbox"):
        self.info = info
        self.sandbox = sandbox

    def __repr__(self) -> str:
        return f"<Process {self.id} pid {self.pid} {self.state} in {self.sandbox.id}>"

    @property
    def id(self) -> str:
        """``proc_`` + 16 hex digits; names the process in its sandbox only."""
        return self.info.id

    @property
    def pid(self) -> int:
        """Its pid inside the sandbox."""
        return self.info.pid

    @property
    def argv(self) -> List[str]:
        return self.info.argv

    @property
    def started_at(self) -> str:
        """RFC 3339."""
        return self.info.started_at

    @property
    def state(self) -> str:
        """``running`` or ``exited``."""
        return self.info.state

    @property
    def exit_code(self) -> Optional[int]:
        """Once exited: its status (128+N when killed by signal N)."""
        return self.info.exit_code

    @property
    def reason(self) -> Optional[ExecReason]:
        """Once exited: why (exited, signaled, timeout, cpu_limit, cancelled...)."""
        return self.info.reason

    @property
    def cpu_ms(self) -> int:
        return self.info.cpu_ms

    @property
    def output_bytes(self) -> int:
        """Output so far, stdout and stderr together."""
        return self.info.output_bytes

    @property
    def first_offset(self) -> int:
        """The oldest offset still kept."""
        return self.info.first_offset

    @property
    def stdin_open(self) -> bool:
        return self.info.stdin_open

    @property
    def running(self) -> bool:
        return self.info.running

    def _call(self, method: str, route: str, **kw: Any) -> Response:
        return self.sandbox._client.call(method, route, params={"id": self.sandbox.id, "pid": self.id}, **kw)

    def _update(self, r: Response) -> ProcessInfo:
        self.info = ProcessInfo.from_dict(r.json())
        return self.info

    def refresh(self) -> "Process":
        self._update(self._call("GET", "/v1/sandboxes/{id}/processes/{pid}"))
        return self

    def wait(self, timeout: Optional[float] = None) -> ProcessInfo:
        """Waits until the process has exited, or `timeout` seconds have
        passed (None: as long as it takes; the API counts whole seconds, so
        a fraction rounds up), and returns its info: check `state` (still
        ``running`` after a timeout) and `exit_code`."""
        if timeout is not None and timeout <= 0:
            return self.refresh().info
        deadline = None if timeout is None else time.monotonic() + timeout
        info: Optional[ProcessInfo] = None
        while True:
            if deadline is None:
                secs = MAX_WAIT_S
            else:
                left = deadline - time.monotonic()
                if info is not None and left <= 0.1:
                    return info
                secs = min(MAX_WAIT_S, max(1, math.ceil(left)))
            # Waiting does nothing, so a dropped connection may be retried.
            info = self._update(self._call("POST", "/v1/sandboxes/{id}/processes/{pid}/wait",
                                           query={"timeout_seconds": str(secs)}, idempotent=True,
                                           timeout=secs + EXEC_GRACE_S))
            if not info.running:
                return info

    def kill(self) -> ProcessInfo:
        """Kills the process and everything it started (``reason``
        ``cancelled``) and returns its final info. Killing one that has
        exited already just returns its info."""
        return self._update(self._call("DELETE", "/v1/sandboxes/{id}/processes/{pid}"))

    def signal(self, signal: Union[str, int]) -> ProcessInfo:
        """Sends a signal to the process's group: a name (``"SIGTERM"``,
        ``"TERM"``) or number from HUP INT QUIT KILL USR1 USR2 TERM CONT STOP
        WINCH (others are BadRequest). Returns its info right after."""
        return self._update(self._call("POST", "/v1/sandboxes/{id}/processes/{pid}/signal",
                                       json={"signal": signal}))

    def send_stdin(self, data: Union[str, bytes]) -> None:
        """Writes to the process's stdin (a str as UTF-8), at most 1 MiB a
        call (TooLarge). Conflict once stdin is closed; RateLimited while
        4 MiB sit queued that the process has not read."""
        if isinstance(data, str):
            data = data.encode("utf-8")
        self._call("POST", "/v1/sandboxes/{id}/processes/{pid}/stdin", data=data,
                   headers={"Content-Type": "application/octet-stream"})

    def close_stdin(self) -> None:
        """Closes stdin once what is queued has been written (the process
        reads end of file)."""
        self._call("POST", "/v1/sandboxes/{id}/processes/{pid}/stdin/close")

    def output(self, offset: int = 0, *, follow: bool = True,
               encoding: OutputEncoding = "text") -> ProcessOutput:
        """Its output from `offset` (0: all of it still kept, the last
        1 MiB): with `follow`, until it exits, else what there is so far.
        ``encoding="base64"`` gives chunks of exact `bytes`. The stream opens
        here, so HTTP errors (NotFound...) raise here."""
        if encoding not in ("text", "base64"):
            raise ValueError(f"encoding must be 'text' or 'base64', not {encoding!r}")
        query = [("offset", str(offset)), ("follow", "true" if follow else "false"), ("encoding", encoding)]
        sse = self.sandbox._client.stream("GET", "/v1/sandboxes/{id}/processes/{pid}/output",
                                          params={"id": self.sandbox.id, "pid": self.id}, query=query,
                                          timeout=max(self.sandbox._client.transport.timeout, STREAM_IDLE_S))
        return ProcessOutput(sse, offset, encoding, self)

    def __iter__(self) -> Iterator[ProcessChunk]:
        return self.output()


class _Record:
    """An API object: `.id`, and every field of its `.info` as an attribute."""

    info: Any

    @property
    def id(self) -> str:
        return str(self.info.id)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name == "info":
            raise AttributeError(name)
        try:
            return getattr(self.info, name)
        except AttributeError:
            raise AttributeError(f"'{type(self).__name__}' has no attribute {name!r}") from None


class Terminal:
    """A pseudo-terminal in the sandbox over a WebSocket (`Sandbox.pty`).
    `write` sends keystrokes, `read` returns output bytes as they come,
    `resize` changes the window, `wait` gives the `TerminalExit`. Closing it
    (or leaving a `with` block) ends the terminal and everything started in
    it."""

    def __init__(self, ws: WebSocket):
        self._ws = ws
        self._q: "queue.Queue[Optional[bytes]]" = queue.Queue()
        self._pending = b""
        self._eof = False
        self.exit: Optional[TerminalExit] = None
        self.errors: List[Dict[str, Any]] = []
        # The window the terminal reported in the last resize answer.
        self.size: Optional[Tuple[int, int]] = None
        # Every resize gets exactly one answer, in order: `resized`, or an
        # error (`resize_failed`, `invalid_resize`).
        self._resizes_sent = 0
        self._resize_answers: List[Dict[str, Any]] = []
        self._answered = threading.Condition()
        self._done = threading.Event()
        self._reader = threading.Thread(target=self._read_loop, name="hatchery-pty", daemon=True)
        self._reader.start()

    def _read_loop(self) -> None:
        closed: Optional[Dict[str, Any]] = None
        try:
            while True:
                kind, data = self._ws.recv()
                if kind == "binary":
                    self._q.put(data)
                    continue
                try:
                    msg = _json.loads(data)
                except ValueError:
                    continue
                t = msg.get("type")
                if t == "exit":
                    self.exit = TerminalExit(exit_code=msg.get("exit_code"), reason=msg.get("reason", "exited"),
                                             signal=msg.get("signal"))
                elif t == "closed":
                    closed = msg
                elif t == "error":
                    self.errors.append(msg)
                    if msg.get("code") in ("resize_failed", "invalid_resize"):
                        self._answer(msg)
                elif t == "resized":
                    self.size = (msg.get("cols"), msg.get("rows"))
                    self._answer(msg)
        except Closed as e:
            if self.exit is None:
                self.exit = TerminalExit(exit_code=None, reason=(closed or {}).get("reason") or e.reason or "closed",
                                         close_code=e.code, message=(closed or {}).get("message"))
            else:
                self.exit.close_code = e.code
        except Exception as e:  # noqa: BLE001 - the reader must always finish
            if self.exit is None:
                self.exit = TerminalExit(exit_code=None, reason="error", message=repr(e))
        finally:
            self._q.put(None)
            self._done.set()
            with self._answered:
                self._answered.notify_all()

    def _answer(self, msg: Dict[str, Any]) -> None:
        with self._answered:
            self._resize_answers.append(msg)
            self._answered.notify_all()

    def write(self, data: Union[str, bytes]) -> None:
        """Keystrokes or a paste (str is sent as UTF-8)."""
        self._ws.send_binary(data.encode("utf-8") if isinstance(data, str) else bytes(data))

    def resize(self, cols: int, rows: int, *, timeout: Optional[float] = None) -> None:
        """A new window size. With `timeout`, waits that long for the guest's
        answer: returns once the terminal reports the new size (`size`),
        raises GuestError if it did not take, BadRequest if it was refused,
        SandboxTimeout if no answer came."""
        with self._answered:
            self._resizes_sent += 1
            n = self._resizes_sent
        self._ws.send_text(_json.dumps({"type": "resize", "cols": cols, "rows": rows}))
        if timeout is None:
            return
        deadline = time.monotonic() + timeout
        with self._answered:
            while len(self._resize_answers) < n:
                left = deadline - time.monotonic()
                if left <= 0 or self._done.is_set():
                    raise errors.SandboxTimeout(f"no answer to the resize to {cols}x{rows} within {timeout} s"
                                         f" (errors so far: {self.errors})")
                self._answered.wait(left)
            a = self._resize_answers[n - 1]
        if a.get("type") == "resized":
            return
        if a.get("code") == "invalid_resize":
            raise errors.BadRequest(a.get("message", "invalid resize"), code="invalid_resize")
        raise errors.GuestError(a.get("message", "the resize did not take"), code=a.get("code"))

    def read(self, timeout: Optional[float] = None) -> bytes:
        """The output that has come (waiting up to `timeout` seconds for
        some; None waits for ever); b"" on timeout or once the terminal has
        ended and everything was read."""
        if self._eof:
            return b""
        try:
            first = self._q.get(timeout=timeout)
        except queue.Empty:
            return b""
        chunks = []
        item: Optional[bytes] = first
        while True:
            if item is None:
                self._eof = True
                break
            chunks.append(item)
            try:
                item = self._q.get_nowait()
            except queue.Empty:
                break
        return b"".join(chunks)

    def read_until(self, needle: Union[str, bytes], timeout: float = 10.0) -> bytes:
        """Reads until `needle` appears in the output; returns all read so far.
        Raises SandboxTimeout if it does not appear within `timeout`."""
        if isinstance(needle, str):
            needle = needle.encode()
        deadline = time.monotonic() + timeout
        buf = self._pending
        while needle not in buf:
            left = deadline - time.monotonic()
            if left <= 0 or self._eof:
                self._pending = buf
                raise errors.SandboxTimeout(f"{needle!r} did not appear in the terminal: {buf[-500:]!r}")
            buf += self.read(timeout=left)
        i = buf.index(needle) + len(needle)
        self._pending = buf[i:]
        return buf[:i]

    def wait(self, timeout: Optional[float] = None) -> TerminalExit:
        """Waits for the terminal to end (its program exits, or the server
        closes it); output not read is dropped from the queue meanwhile only
        if read later. Raises SandboxTimeout past `timeout`."""
        if not self._done.wait(timeout):
            raise errors.SandboxTimeout(f"the terminal did not end within {timeout}s")
        assert self.exit is not None
        return self.exit

    @property
    def closed(self) -> bool:
        return self._done.is_set()

    def close(self) -> None:
        self._ws.close()
        self._done.wait(5)

    def __enter__(self) -> "Terminal":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Sandbox(_Record):
    """A live sandbox. Its fields (template, state, expires_at, metadata,
    boot_mode...) are those of `info`, readable as attributes. Used as a
    context manager, it is killed when the block ends, also on an error."""

    def __init__(self, info: SandboxInfo, client: Optional[Client] = None):
        self.info = info
        self._client = client or default_client()
        self.filesystem = Filesystem(self)
        self.files = self.filesystem
        self.network = Network(self)

    def __repr__(self) -> str:
        return f"<Sandbox {self.id} {self.info.template} expires {self.info.expires_at}>"

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.kill()

    @classmethod
    def create(cls, template: Optional[str] = None, *, ttl_seconds: Optional[int] = None,
               metadata: Optional[Dict[str, str]] = None, env: Optional[Dict[str, str]] = None,
               network: Optional[PolicyLike] = None, client: Optional[Client] = None) -> "Sandbox":
        c = client or default_client()
        body = _drop_none({"template": template, "ttl_seconds": ttl_seconds, "metadata": metadata, "env": env,
                           "network": policy_dict(network)})
        return cls(SandboxInfo.from_dict(c.call("POST", "/v1/sandboxes", json=body).json()), c)

    @classmethod
    def get(cls, sandbox_id: str, *, client: Optional[Client] = None) -> "Sandbox":
        c = client or default_client()
        return cls(SandboxInfo.from_dict(c.call("GET", "/v1/sandboxes/{id}", params={"id": sandbox_id}).json()), c)

    connect = get

    @classmethod
    def list(cls, metadata: Optional[Dict[str, str]] = None, *, client: Optional[Client] = None) -> List["Sandbox"]:
        c = client or default_client()
        r = c.call("GET", "/v1/sandboxes", query=metadata_query(metadata)).json()
        return [cls(SandboxInfo.from_dict(s), c) for s in r["sandboxes"]]

    def refresh(self) -> "Sandbox":
        self.info = SandboxInfo.from_dict(
            self._client.call("GET", "/v1/sandboxes/{id}", params={"id": self.id}).json())
        return self

    def is_running(self) -> bool:
        try:
            return bool(self.refresh().info.state == "running")
        except errors.NotFound:
            return False

    def kill(self) -> None:
        """Idempotent: killing a sandbox that is already gone is fine."""
        self._client.call("DELETE", "/v1/sandboxes/{id}", params={"id": self.id})

    def set_ttl(self, ttl_seconds: int) -> "Sandbox":
        """The sandbox now expires `ttl_seconds` from now."""
        self.info = SandboxInfo.from_dict(self._client.call(
            "PATCH", "/v1/sandboxes/{id}", params={"id": self.id}, json={"ttl_seconds": ttl_seconds}).json())
        return self

    @overload
    def exec(self, cmd: Optional[str] = None, *, argv: Optional[List[str]] = None,
             timeout_seconds: Optional[int] = None, cwd: Optional[str] = None, env: Optional[Dict[str, str]] = None,
             stdin: Optional[Union[str, bytes]] = None, max_output_bytes: Optional[int] = None,
             cpu_limit_ms: Optional[int] = None, cpu_limit_basis: Optional[CpuLimitBasis] = None,
             output: OutputEncoding = "text",
             background: Literal[False] = False) -> ExecResult: ...

    @overload
    def exec(self, cmd: Optional[str] = None, *, argv: Optional[List[str]] = None,
             timeout_seconds: Optional[int] = None, cwd: Optional[str] = None, env: Optional[Dict[str, str]] = None,
             stdin: Optional[Union[str, bytes]] = None, max_output_bytes: Optional[int] = None,
             cpu_limit_ms: Optional[int] = None, cpu_limit_basis: Optional[CpuLimitBasis] = None,
             output: OutputEncoding = "text",
             background: Literal[True]) -> Process: ...

    def exec(self, cmd: Optional[str] = None, *, argv: Optional[List[str]] = None,
             timeout_seconds: Optional[int] = None, cwd: Optional[str] = None, env: Optional[Dict[str, str]] = None,
             stdin: Optional[Union[str, bytes]] = None, max_output_bytes: Optional[int] = None,
             cpu_limit_ms: Optional[int] = None, cpu_limit_basis: Optional[CpuLimitBasis] = None,
             output: OutputEncoding = "text",
             background: bool = False) -> Union[ExecResult, Process]:
        """Runs `cmd` with /bin/sh -c (or `argv` without a shell) and waits.
        A non-zero exit or a timeout is a result, not an exception:
        `reason` says why it ended. `cpu_limit_ms` (1 to the timeout) kills
        everything the command started once it has used that much CPU time
        (reason ``cpu_limit``), judged on the command's own CPU as the guest
        counts it, or with ``cpu_limit_basis="host"`` on the host's count
        for the whole sandbox (`host_cpu_ms`, steadier on a busy host); an
        output stream passing `max_output_bytes`
        ends the command (reason ``output_limit``). ``output="base64"``
        brings the exact bytes: `ExecResult.stdout_bytes` / `stderr_bytes`.

        ``background=True`` starts it and returns a `Process` at once; it
        runs until it exits, is killed, or `timeout_seconds` (if given) pass,
        or the sandbox goes. `stdin` is written to it and stdin stays open.
        At most 16 run at once per sandbox: the 17th raises RateLimited
        (``too_many``)."""
        body = _exec_body(cmd, argv, timeout_seconds, cwd, env, stdin, max_output_bytes, cpu_limit_ms, output,
                          background, cpu_limit_basis)
        if background:
            r = self._client.call("POST", "/v1/sandboxes/{id}/exec", params={"id": self.id}, json=body)
            return Process(ProcessInfo.from_dict(r.json()), self)
        r = self._client.call("POST", "/v1/sandboxes/{id}/exec", params={"id": self.id}, json=body,
                              timeout=_http_timeout(timeout_seconds))
        return ExecResult.from_dict(r.json(), output)

    def exec_stream(self, cmd: Optional[str] = None, *, argv: Optional[List[str]] = None,
                    timeout_seconds: Optional[int] = None, cwd: Optional[str] = None,
                    env: Optional[Dict[str, str]] = None, stdin: Optional[Union[str, bytes]] = None,
                    max_output_bytes: Optional[int] = None, on_stdout: Optional[Callable[[Any], None]] = None,
                    on_stderr: Optional[Callable[[Any], None]] = None,
                    cpu_limit_ms: Optional[int] = None, cpu_limit_basis: Optional[CpuLimitBasis] = None,
             output: OutputEncoding = "text") -> ExecStream:
        """Same arguments as `exec` (not `background`), plus callbacks for
        each chunk. With ``output="base64"`` chunks (and callbacks) get
        `bytes`."""
        body = _exec_body(cmd, argv, timeout_seconds, cwd, env, stdin, max_output_bytes, cpu_limit_ms, output,
                          cpu_limit_basis=cpu_limit_basis)
        # The daemon sends a keep-alive comment every 15 s while the command
        # is silent, so a read timeout longer than that means a dead stream.
        sse = self._client.stream("POST", "/v1/sandboxes/{id}/exec/stream", params={"id": self.id}, json=body,
                                  timeout=max(self._client.transport.timeout, STREAM_IDLE_S))
        return ExecStream(sse, on_stdout, on_stderr, output)

    # Background processes ---------------------------------------------------

    def processes(self) -> List[Process]:
        """The sandbox's background processes: those running and the last 64
        that exited."""
        r = self._client.call("GET", "/v1/sandboxes/{id}/processes", params={"id": self.id})
        return [Process(ProcessInfo.from_dict(p), self) for p in r.json()["processes"]]

    def process(self, process_id: Union[str, Process]) -> Process:
        """A background process by its id (``proc_...``), e.g. to reconnect
        from another program; NotFound (``process_not_found``) if the
        sandbox has none of that id."""
        pid = process_id.id if isinstance(process_id, Process) else process_id
        r = self._client.call("GET", "/v1/sandboxes/{id}/processes/{pid}", params={"id": self.id, "pid": pid})
        return Process(ProcessInfo.from_dict(r.json()), self)

    # Code interpreter -------------------------------------------------------

    def run_code(self, code: str, *, language: Optional[str] = "python", context: Optional[ContextLike] = None,
                 on_stdout: Optional[Callable[[str], Any]] = None, on_stderr: Optional[Callable[[str], Any]] = None,
                 on_result: Optional[Callable[[Result], Any]] = None,
                 on_error: Optional[Callable[[ExecutionError], Any]] = None, envs: Optional[Dict[str, str]] = None,
                 timeout: Optional[float] = None, cpu_limit_ms: Optional[int] = None,
                 max_output_bytes: Optional[int] = None) -> Execution:
        """Runs a cell in a stateful interpreter: the sandbox's default
        context (already running), or `context` (a CodeContext or its id).
        Variables persist between calls in the same context.

        `timeout` is in seconds (default 30, whole seconds, a fraction rounds
        up); past it, or past `cpu_limit_ms` of CPU time, the cell is killed
        and the context restarted (`reason` timeout / cpu_limit,
        `restarted` True). `envs` are set in os.environ for this run only.
        An exception in the cell is `Execution.error`, not a Python error.

        With any callback given, the cell's output is streamed: on_stdout /
        on_stderr get each chunk (str), on_result each Result, on_error the
        ExecutionError, as they happen; run_code still returns the whole
        Execution at the end."""
        body = _drop_none({"code": code, "language": language, "context_id": context_id(context),
                           "timeout_seconds": _whole_seconds(timeout), "cpu_limit_ms": cpu_limit_ms,
                           "max_output_bytes": max_output_bytes, "env": envs})
        params = {"id": self.id}
        if on_stdout is None and on_stderr is None and on_result is None and on_error is None:
            r = self._client.call("POST", "/v1/sandboxes/{id}/code", params=params, json=body,
                                  timeout=_http_timeout(body.get("timeout_seconds"), DEFAULT_CODE_TIMEOUT_S))
            return Execution.from_dict(r.json())
        events = _CodeEvents(on_stdout, on_stderr, on_result, on_error)
        sse = self._client.stream("POST", "/v1/sandboxes/{id}/code/stream", params=params, json=body,
                                  timeout=max(self._client.transport.timeout, STREAM_IDLE_S))
        try:
            for kind, data in sse:
                done = events.feed(kind, data)
                if done is not None:
                    return done
            raise errors.StreamError("code stream ended without a done event")
        finally:
            sse.close()  # also when a callback raised: that cancels the run

    def create_code_context(self, cwd: Optional[str] = None, language: Optional[str] = None) -> CodeContext:
        """A new interpreter with its own variables (at most 16 contexts per
        sandbox: Conflict beyond). `cwd` default /workspace, `language`
        default python."""
        r = self._client.call("POST", "/v1/sandboxes/{id}/code/contexts", params={"id": self.id},
                              json=_drop_none({"cwd": cwd, "language": language}))
        return CodeContext.from_dict(r.json())

    def list_code_contexts(self) -> List[CodeContext]:
        """Every context of the sandbox, ``default`` included."""
        r = self._client.call("GET", "/v1/sandboxes/{id}/code/contexts", params={"id": self.id})
        return [CodeContext.from_dict(c) for c in r.json()["contexts"]]

    def restart_code_context(self, context: ContextLike) -> CodeContext:
        """Replaces the context's interpreter with a clean one (its
        variables are gone); ``default`` can be restarted too."""
        r = self._client.call("POST", "/v1/sandboxes/{id}/code/contexts/{context_id}/restart",
                              params={"id": self.id, "context_id": str(context_id(context))},
                              timeout=max(self._client.transport.timeout, 60.0))
        return CodeContext.from_dict(r.json())

    def remove_code_context(self, context: ContextLike) -> None:
        """Stops the context's interpreter; ``default`` cannot be removed
        (BadRequest)."""
        self._client.call("DELETE", "/v1/sandboxes/{id}/code/contexts/{context_id}",
                          params={"id": self.id, "context_id": str(context_id(context))})

    # Ports ----------------------------------------------------------------

    def _port_prefix(self, port: int) -> str:
        return f"/v1/sandboxes/{quote(self.id, safe='')}/ports/{int(port)}"

    def get_url(self, port: int, *, path: str = "/") -> str:
        """The URL of `path` on the server listening on 127.0.0.1:`port` in
        the sandbox, through the daemon. It needs the API key (send it as
        `Authorization: Bearer`): for server-side use; give a browser
        `preview_url` instead. `path` is sent as is (query included)."""
        return self._client.url.rstrip("/") + self._port_prefix(port) + "/" + path.lstrip("/")

    def port_request(self, port: int, method: str = "GET", path: str = "/",
                     body: Optional[Union[str, bytes]] = None, headers: Optional[Dict[str, str]] = None, *,
                     timeout: Optional[float] = None) -> Tuple[int, Dict[str, str], bytes]:
        """One HTTP request to the server on `port` in the sandbox, with the
        key: (status, headers, body) of the guest server's answer, whatever
        its status. The daemon's own errors (400 `invalid_port`, 502
        `port_closed`, 429 too many connections, 404...) raise."""
        status, h, b = self._client.raw(method.upper(), self._port_prefix(port) + "/" + path.lstrip("/"),
                                        body=body, headers=headers, timeout=timeout)
        if status >= 400 and h.get("content-type", "").startswith("application/json"):
            try:
                code = _json.loads(b)["error"]["code"]
            except (ValueError, KeyError, TypeError):
                code = None
            if code in ("invalid_port", "port_closed", "bad_gateway", "too_many_connections", "sandbox_not_found",
                        "sandbox_not_running", "guest_unresponsive", "unauthorized"):
                raise_for(status, h, b)
        return status, h, b

    def preview_url(self, port: int, ttl_seconds: Optional[int] = 3600) -> PreviewUrl:
        """A signed URL (under /preview/{token}/) that serves `port` without
        the API key until it expires (`ttl_seconds`, 1 to 86400)."""
        body = _drop_none({"ttl_seconds": ttl_seconds})
        r = self._client.call("POST", "/v1/sandboxes/{id}/ports/{port}/preview-url",
                              params={"id": self.id, "port": str(int(port))}, json=body)
        return PreviewUrl.from_dict(r.json())

    # Terminals ------------------------------------------------------------

    def pty_token(self) -> TerminalToken:
        """A token that opens one terminal of this sandbox once, within 60 s
        (for a browser: `?token=` on the pty WebSocket)."""
        r = self._client.call("POST", "/v1/sandboxes/{id}/pty/token", params={"id": self.id})
        return TerminalToken.from_dict(r.json())

    def pty(self, cols: int = 80, rows: int = 24, cmd: Optional[str] = None, cwd: Optional[str] = None, *,
            argv: Optional[List[str]] = None, env: Optional[Dict[str, str]] = None,
            token: Optional[str] = None, timeout: float = 30.0) -> Terminal:
        """Opens a terminal: the login shell, or `cmd` (through /bin/sh -c)
        or `argv`, in a `cols` x `rows` window. With `token` (from
        `pty_token`) instead of the API key."""
        if cmd is not None and argv is not None:
            raise ValueError("give at most one of cmd and argv")
        q: List[Tuple[str, str]] = [("cols", str(cols)), ("rows", str(rows))]
        if cwd is not None:
            q.append(("cwd", cwd))
        if cmd is not None:
            q.append(("cmd", cmd))
        if argv is not None:
            q.append(("argv", _json.dumps(argv)))
        if env is not None:
            q.append(("env", _json.dumps(env)))
        if token is not None:
            q.append(("token", token))
        headers = {"User-Agent": self._client.transport._headers(None)["User-Agent"]}
        if token is None and self._client.transport._key:
            headers["Authorization"] = f"Bearer {self._client.transport._key}"
        url = self._client.url.rstrip("/") + path("/v1/sandboxes/{id}/pty", id=self.id) + "?" + urlencode(q)
        return Terminal(WebSocket.connect(url, headers, timeout=timeout))

    def snapshot(self, retention_seconds: Optional[int] = None, *,
                 metadata: Optional[Dict[str, str]] = None, memory: Optional[bool] = None) -> "Snapshot":
        """memory=False keeps the sandbox's files only (a filesystem-only pause)."""
        body = _drop_none({"retention_seconds": retention_seconds, "metadata": metadata, "memory": memory})
        r = self._client.call("POST", "/v1/sandboxes/{id}/snapshots", params={"id": self.id}, json=body,
                              timeout=max(self._client.transport.timeout, 120.0))
        return Snapshot(SnapshotInfo.from_dict(r.json()), self._client)


class Snapshot(_Record):
    """A saved state of a sandbox; fork it into new sandboxes."""

    def __init__(self, info: SnapshotInfo, client: Optional[Client] = None):
        self.info = info
        self._client = client or default_client()

    def __repr__(self) -> str:
        return f"<Snapshot {self.id} of {self.info.sandbox_id}>"

    @classmethod
    def get(cls, snapshot_id: str, *, client: Optional[Client] = None) -> "Snapshot":
        c = client or default_client()
        return cls(SnapshotInfo.from_dict(c.call("GET", "/v1/snapshots/{id}", params={"id": snapshot_id}).json()), c)

    @classmethod
    def list(cls, metadata: Optional[Dict[str, str]] = None, *,
             client: Optional[Client] = None) -> List["Snapshot"]:
        c = client or default_client()
        r = c.call("GET", "/v1/snapshots", query=metadata_query(metadata)).json()
        return [cls(SnapshotInfo.from_dict(s), c) for s in r["snapshots"]]

    def delete(self) -> None:
        """Idempotent; the image files are gone when this returns."""
        self._client.call("DELETE", "/v1/snapshots/{id}", params={"id": self.id})

    def pool(self) -> SnapshotPool:
        """This host's warm pool of the snapshot (size 0: none)."""
        return SnapshotPool.from_dict(self._client.call("GET", "/v1/snapshots/{id}/pool",
                                                        params={"id": self.id}).json())

    def set_pool(self, size: int) -> SnapshotPool:
        """Keeps `size` (0..8) forks restored and parked on the host, so that
        a fork claims one instead of restoring; 0 drops the pool. The
        operator's key only (a pool holds host memory)."""
        return SnapshotPool.from_dict(self._client.call("PUT", "/v1/snapshots/{id}/pool", params={"id": self.id},
                                                        json={"size": size}).json())

    def fork(self, *, ttl_seconds: Optional[int] = None, metadata: Optional[Dict[str, str]] = None,
             network: Optional[PolicyLike] = None) -> Sandbox:
        """One new sandbox in the state the snapshot recorded."""
        return self.fork_many(1, ttl_seconds=ttl_seconds, metadata=metadata, network=network)[0]

    def fork_many(self, count: int, *, ttl_seconds: Optional[int] = None, metadata: Optional[Dict[str, str]] = None,
                  network: Optional[PolicyLike] = None) -> List[Sandbox]:
        """`count` (1..16) independent sandboxes; all or nothing."""
        body = _drop_none({"count": count, "ttl_seconds": ttl_seconds, "metadata": metadata,
                           "network": policy_dict(network)})
        r = self._client.call("POST", "/v1/snapshots/{id}/fork", params={"id": self.id}, json=body,
                              timeout=max(self._client.transport.timeout, 60.0 * count))
        return [Sandbox(SandboxInfo.from_dict(s), self._client) for s in r.json()["sandboxes"]]


class Template:
    """Templates: list, inspect, build (with progress) and delete."""

    @staticmethod
    def list(*, client: Optional[Client] = None) -> List[TemplateInfo]:
        c = client or default_client()
        return [TemplateInfo.from_dict(t) for t in c.call("GET", "/v1/templates").json()["templates"]]

    @staticmethod
    def get(name: str, *, client: Optional[Client] = None) -> TemplateInfo:
        c = client or default_client()
        return TemplateInfo.from_dict(c.call("GET", "/v1/templates/{name}", params={"name": name}).json())

    @staticmethod
    def delete(name: str, *, client: Optional[Client] = None) -> None:
        c = client or default_client()
        c.call("DELETE", "/v1/templates/{name}", params={"name": name})

    @staticmethod
    def start_build(name: str, *, base: Optional[str] = None, packages: Optional[List[str]] = None,
                    pip: Optional[List[str]] = None, files: Optional[Dict[str, str]] = None, setup: Optional[List[str]] = None,
                    cpus: Optional[float] = None, memory_mb: Optional[int] = None, pids_max: Optional[int] = None,
                    disk_mb: Optional[int] = None, network: Optional[PolicyLike] = None,
                    client: Optional[Client] = None) -> BuildAccepted:
        """Starts a build and returns at once (202); follow it with
        `build_events`."""
        c = client or default_client()
        body = _drop_none({"name": name, "base": base, "packages": packages, "pip": pip, "files": files, "setup": setup,
                           "cpus": cpus, "memory_mb": memory_mb, "pids_max": pids_max, "disk_mb": disk_mb,
                           "network": policy_dict(network)})
        return BuildAccepted.from_dict(c.call("POST", "/v1/templates", json=body).json())

    @staticmethod
    def build_events(name: str, build_id: str, *, client: Optional[Client] = None) -> Iterator[BuildEvent]:
        """Every event of the build from its start (history first), ending
        after `done` or `error`; raises StreamError if it ends otherwise."""
        c = client or default_client()
        sse = c.stream("GET", "/v1/templates/{name}/builds/{id}/events", params={"name": name, "id": build_id},
                       timeout=max(c.transport.timeout, 120.0))
        try:
            for kind, data in sse:
                yield BuildEvent(kind, data or {})
                if kind in ("done", "error"):
                    return
            raise errors.StreamError("build event stream ended without done or error")
        finally:
            sse.close()

    @staticmethod
    def build(name: str, *, base: Optional[str] = None, packages: Optional[List[str]] = None,
              pip: Optional[List[str]] = None, files: Optional[Dict[str, str]] = None, setup: Optional[List[str]] = None,
              cpus: Optional[float] = None, memory_mb: Optional[int] = None, pids_max: Optional[int] = None,
              disk_mb: Optional[int] = None, network: Optional[PolicyLike] = None,
              on_progress: Optional[Callable[[int, str], None]] = None,
              on_log: Optional[Callable[[str], None]] = None, client: Optional[Client] = None) -> TemplateInfo:
        """Builds and waits: `on_progress(percent, step)` for each step,
        `on_log(line)` for each log line. Returns the activated template;
        raises BuildFailed if the build fails."""
        c = client or default_client()
        acc = Template.start_build(name, base=base, packages=packages, pip=pip, files=files, setup=setup, cpus=cpus,
                                   memory_mb=memory_mb, pids_max=pids_max, disk_mb=disk_mb, network=network, client=c)
        for ev in Template.build_events(name, acc.build_id, client=c):
            if ev.kind == "step" and on_progress:
                on_progress(int(ev.data.get("percent", 0)), str(ev.data.get("step", "")))
            elif ev.kind == "log" and on_log:
                on_log(str(ev.data.get("line", "")))
            elif ev.kind == "done":
                if on_progress:
                    on_progress(100, "done")
            elif ev.kind == "error":
                err = ev.data.get("error") or {}
                raise errors.BuildFailed(err.get("message", "build failed"), code=err.get("code", "build_failed"))
        return Template.get(name, client=c)


class Policies:
    """Tool and egress policies (docs/policy.md): ordered rules, first match
    wins, default deny. Versions are immutable; `rules` are dicts in the
    document format, e.g. {"id": "no-main", "effect": "deny", "match":
    {"tools": ["git_push"], "args": [{"field": "branch", "op": "eq", "value": "main"}]}}."""

    @staticmethod
    def create(name: str, rules: List[Dict[str, Any]], *, description: Optional[str] = None,
               client: Optional[Client] = None) -> StoredPolicy:
        """A new policy at version 1; BadRequest names the first bad rule."""
        c = client or default_client()
        body = _drop_none({"name": name, "description": description, "rules": rules})
        return StoredPolicy.from_dict(c.call("POST", "/v1/policies", json=body).json())

    @staticmethod
    def add_version(policy_id: str, name: str, rules: List[Dict[str, Any]], *, description: Optional[str] = None,
                    client: Optional[Client] = None) -> StoredPolicy:
        """The next version; earlier versions (and sessions pinned to them) keep their rules."""
        c = client or default_client()
        body = _drop_none({"name": name, "description": description, "rules": rules})
        return StoredPolicy.from_dict(
            c.call("POST", "/v1/policies/{id}/versions", params={"id": policy_id}, json=body).json())

    @staticmethod
    def list(*, client: Optional[Client] = None) -> List[PolicySummary]:
        c = client or default_client()
        return [PolicySummary.from_dict(p) for p in c.call("GET", "/v1/policies").json()["policies"]]

    @staticmethod
    def get(policy_id: str, *, client: Optional[Client] = None) -> StoredPolicy:
        """The latest version."""
        c = client or default_client()
        return StoredPolicy.from_dict(c.call("GET", "/v1/policies/{id}", params={"id": policy_id}).json())

    @staticmethod
    def get_version(policy_id: str, version: int, *, client: Optional[Client] = None) -> StoredPolicy:
        c = client or default_client()
        return StoredPolicy.from_dict(c.call("GET", "/v1/policies/{id}/versions/{version}",
                                             params={"id": policy_id, "version": str(version)}).json())


class Secrets:
    """Secrets for credential rules (docs/policy.md, "Credentials"): each
    key works on its own (a tenant key's are its tenant's; the operator
    key lists every owner's). A value is write-only: the egress proxy adds
    it to the requests a policy's credential rule names, and no route
    returns it."""

    @staticmethod
    def create(name: str, value: str, *, client: Optional[Client] = None) -> Secret:
        """Stores `value` under `name` (Conflict, `secret_exists`, if taken)."""
        c = client or default_client()
        return Secret.from_dict(c.call("POST", "/v1/secrets", json={"name": name, "value": value}).json())

    @staticmethod
    def list(*, client: Optional[Client] = None) -> List[Secret]:
        c = client or default_client()
        return [Secret.from_dict(s) for s in c.call("GET", "/v1/secrets").json()["secrets"]]

    @staticmethod
    def delete(name: str, *, client: Optional[Client] = None) -> None:
        c = client or default_client()
        c.call("DELETE", "/v1/secrets/{name}", params={"name": name})


class Tenants:
    """Tenants and their API keys (docs/api.md, "Tenants"): operator key
    only. A tenant's key sees and acts on its own sandboxes and snapshots;
    `limits` keys are tokens, usd_cents, concurrent_sessions,
    live_sandboxes and wall_clock_seconds (absent: unlimited)."""

    @staticmethod
    def create(name: str, *, limits: Optional[Dict[str, int]] = None,
               client: Optional[Client] = None) -> Tenant:
        c = client or default_client()
        body = _drop_none({"name": name, "limits": limits})
        return Tenant.from_dict(c.call("POST", "/v1/tenants", json=body).json())

    @staticmethod
    def list(*, client: Optional[Client] = None) -> List[Tenant]:
        c = client or default_client()
        return [Tenant.from_dict(t) for t in c.call("GET", "/v1/tenants").json()["tenants"]]

    @staticmethod
    def get(tenant_id: str, *, client: Optional[Client] = None) -> Tenant:
        c = client or default_client()
        return Tenant.from_dict(c.call("GET", "/v1/tenants/{id}", params={"id": tenant_id}).json())

    @staticmethod
    def update(tenant_id: str, *, name: Optional[str] = None, limits: Optional[Dict[str, int]] = None,
               client: Optional[Client] = None) -> Tenant:
        """`limits`, when given, replaces all five (an absent one becomes unlimited)."""
        c = client or default_client()
        body = _drop_none({"name": name, "limits": limits})
        return Tenant.from_dict(c.call("PATCH", "/v1/tenants/{id}", params={"id": tenant_id}, json=body).json())

    @staticmethod
    def delete(tenant_id: str, *, client: Optional[Client] = None) -> None:
        """Refused (Conflict, `tenant_in_use`) while it has live sandboxes."""
        c = client or default_client()
        c.call("DELETE", "/v1/tenants/{id}", params={"id": tenant_id})

    @staticmethod
    def create_key(tenant_id: str, *, client: Optional[Client] = None) -> CreatedKey:
        """A new key; `.key` is shown this once (only its hash is kept)."""
        c = client or default_client()
        return CreatedKey.from_dict(c.call("POST", "/v1/tenants/{id}/keys", params={"id": tenant_id}).json())

    @staticmethod
    def list_keys(tenant_id: str, *, client: Optional[Client] = None) -> List[TenantKey]:
        c = client or default_client()
        keys = c.call("GET", "/v1/tenants/{id}/keys", params={"id": tenant_id}).json()["keys"]
        return [TenantKey.from_dict(k) for k in keys]

    @staticmethod
    def revoke_key(tenant_id: str, key_id: str, *, client: Optional[Client] = None) -> TenantKey:
        """Refused from the next request on."""
        c = client or default_client()
        return TenantKey.from_dict(c.call("DELETE", "/v1/tenants/{id}/keys/{key_id}",
                                          params={"id": tenant_id, "key_id": key_id}).json())


def _exchange(conn: http_client.HTTPConnection, method: str, target: str, body: Optional[bytes],
              headers: Dict[str, str], what: str) -> Tuple[int, Dict[str, str], bytes]:
    """One request on its own connection, closed after: (status, headers
    with lower-case names, body); any status comes back, not raised."""
    try:
        conn.request(method, target, body=body, headers=headers)
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    except socket.timeout as e:
        raise errors.SandboxTimeout(f"no answer: {method} {what}") from e
    except (OSError, http_client.HTTPException) as e:
        raise errors.ConnectionFailed(f"{method} {what}: {e!r}") from e
    finally:
        conn.close()
