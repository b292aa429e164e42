"""Plain data returned by the API, field for field as in the daemon's
OpenAPI document (docs/openapi.json; tests/test_openapi.py keeps them in
step). Fields the daemon adds later land in `extra` rather than being lost."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field, fields
from typing import Any, Dict, List, Literal, Optional, Type, TypeVar, Union

T = TypeVar("T", bound=Any)

#: Why a command (or a code run) ended.
ExecReason = Literal["exited", "signaled", "timeout", "cpu_limit", "oom", "output_limit", "cancelled"]
#: How output is put in JSON: ``text`` (UTF-8, invalid bytes as U+FFFD) or
#: ``base64`` (the exact bytes; this SDK decodes them to `bytes`).
OutputEncoding = Literal["text", "base64"]
#: The clock an exec's `cpu_limit_ms` is judged on: the command's own CPU
#: as the guest counts it, or the host's count for the whole sandbox.
CpuLimitBasis = Literal["guest", "host"]


def _from(cls: Type[T], d: Dict[str, Any]) -> T:
    names = {f.name for f in fields(cls)} - {"extra"}
    obj: T = cls(**{k: v for k, v in d.items() if k in names})
    setattr(obj, "extra", {k: v for k, v in d.items() if k not in names})
    return obj


@dataclass
class SandboxInfo:
    id: str
    template: str
    state: str
    created_at: str
    expires_at: str
    metadata: Dict[str, str] = field(default_factory=dict)
    boot_mode: Optional[str] = None
    boot_ms: Optional[int] = None
    # Lost sandboxes only (`list(state="lost")`): the host it was lost
    # with, when and why.
    host: Optional[str] = None
    ended_at: Optional[str] = None
    end_reason: Optional[str] = None
    extra: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "SandboxInfo":
        return _from(cls, d)


@dataclass
class ExecResult:
    """`reason` says why the command ended (exited, signaled, timeout,
    cpu_limit, oom, output_limit, cancelled); `contained` is True when every
    process it started was killed with it and counted in `cpu_ms`;
    `memory_peak_bytes` is the largest memory use seen (sampled), if known."""
    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool
    truncated: bool
    oom_killed: bool
    duration_ms: int
    cpu_ms: int
    reason: ExecReason
    contained: bool
    memory_peak_bytes: Optional[int] = None
    #: CPU the host spent on the whole sandbox while it ran (None: the
    #: daemon cannot tell); what ``cpu_limit_basis="host"`` is judged on.
    host_cpu_ms: Optional[int] = None
    extra: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, d: Dict[str, Any], encoding: Optional[str] = None) -> "ExecResult":
        """With ``encoding="base64"`` the answer's stdout/stderr are base64:
        they are decoded into `stdout_bytes`/`stderr_bytes`, and `stdout`/
        `stderr` hold their UTF-8 decoding (U+FFFD for invalid bytes)."""
        if encoding != "base64":
            return _from(cls, d)
        d = dict(d)
        raw = {k: base64.b64decode(d.get(k) or "") for k in ("stdout", "stderr")}
        d.update({k: v.decode("utf-8", "replace") for k, v in raw.items()})
        r = _from(cls, d)
        setattr(r, "_raw", raw)
        return r

    def _bytes(self, name: str) -> bytes:
        raw: Optional[Dict[str, bytes]] = getattr(self, "_raw", None)
        if raw is not None:
            return raw[name]
        text: str = getattr(self, name)
        return text.encode("utf-8")

    @property
    def stdout_bytes(self) -> bytes:
        """The exact bytes with ``output="base64"``; otherwise `stdout`
        encoded as UTF-8 (invalid bytes were already replaced by U+FFFD)."""
        return self._bytes("stdout")

    @property
    def stderr_bytes(self) -> bytes:
        """Like `stdout_bytes`, for stderr."""
        return self._bytes("stderr")

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


@dataclass
class OutputChunk:
    """One piece of streamed output: `stream` is "stdout" or "stderr";
    `data` is text, or `bytes` with ``output="base64"``."""
    stream: str
    data: Union[str, bytes]


#: ``running`` or ``exited``.
ProcessState = Literal["running", "exited"]


@dataclass
class ProcessInfo:
    """A background process. `id` (``proc_`` + 16 hex digits) names it in
    its sandbox; `pid` is its pid inside the sandbox. Once `state` is
    ``exited``: `exit_code` (128+N when killed by signal N), `signal` (the
    signal that ended it, if one did) and `reason` (why it ended, as for an
    exec: exited, signaled, timeout, cancelled...). `cpu_ms` counts
    everything it started. stdout and stderr share one offset space:
    `output_bytes` is the total so far, `first_offset` the oldest byte still
    kept (the last 1 MiB is)."""
    id: str
    pid: int
    argv: List[str]
    started_at: str
    state: str
    cpu_ms: int
    output_bytes: int
    first_offset: int
    stdin_open: bool
    #: Memory ended it (`reason` is then ``oom``).
    oom_killed: bool
    exit_code: Optional[int] = None
    signal: Optional[int] = None
    reason: Optional[ExecReason] = None
    extra: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "ProcessInfo":
        return _from(cls, d)

    @property
    def running(self) -> bool:
        return self.state == "running"


@dataclass
class ProcessChunk:
    """A piece of a background process's output: `stream` ("stdout" or
    "stderr"), `data` (text, or `bytes` with ``encoding="base64"``) and
    `offset`, where its bytes start in the process's output (stdout and
    stderr together)."""
    stream: str
    data: Union[str, bytes]
    offset: int

    @property
    def end_offset(self) -> int:
        """The offset just past this chunk: where to resume reading. Exact
        with ``encoding="base64"`` (and for valid UTF-8 text)."""
        n = len(self.data) if isinstance(self.data, bytes) else len(self.data.encode("utf-8"))
        return self.offset + n


@dataclass
class FileEntry:
    name: str
    type: str
    size: int
    mode: int
    mtime: int
    extra: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "FileEntry":
        return _from(cls, d)


@dataclass
class SnapshotInfo:
    id: str
    sandbox_id: str
    template: str
    created_at: str
    expires_at: str
    size_bytes: int
    # False: the sandbox's files only (a filesystem-only pause); forks boot
    # the template with them and no process survives.
    memory: bool
    metadata: Dict[str, str] = field(default_factory=dict)
    extra: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "SnapshotInfo":
        return _from(cls, d)


@dataclass
class SnapshotPool:
    """A snapshot's warm pool on one host: forks kept restored and parked,
    claimed by the next forks instead of restoring."""
    snapshot_id: str
    size: int
    ready: int
    sandbox_ids: List[str]
    extra: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "SnapshotPool":
        return _from(cls, d)


@dataclass
class TemplateInfo:
    name: str
    version: str
    base: str
    packages: List[str]
    files: List[str]
    setup: List[str]
    cpus: float
    memory_mb: int
    pids_max: int
    disk_mb: int
    checkpoint_ready: bool
    pip: List[str]
    #: `ready`, or `building`: no version is ready yet (the fields are the
    #: spec being built) and creates answer 503 `template_building`.
    state: str
    #: The build in progress, if any: build_id, version, step, percent,
    #: events_url.
    build: Optional[Dict[str, Any]] = None
    extra: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "TemplateInfo":
        return _from(cls, d)


@dataclass
class StoredPolicy:
    """One immutable version of a tool/egress policy (`/v1/policies`).
    `document` is the policy as written: name, description, rules."""
    id: str
    version: int
    created_at: str
    sha256: str
    builtin: bool
    document: Dict[str, Any]
    #: The tenant whose key made the policy (None: the operator's or built in).
    tenant: Optional[str] = None
    extra: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "StoredPolicy":
        return _from(cls, d)


@dataclass
class PolicySummary:
    id: str
    name: str
    latest_version: int
    created_at: str
    updated_at: str
    builtin: bool
    tenant: Optional[str] = None
    extra: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "PolicySummary":
        return _from(cls, d)


@dataclass
class Tenant:
    """A tenant (`/v1/tenants`, operator key only). `limits` maps tokens,
    usd_cents, concurrent_sessions, live_sandboxes and wall_clock_seconds
    to a number, or None for unlimited."""
    id: str
    name: str
    limits: Dict[str, Any]
    created_at: str
    extra: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "Tenant":
        return _from(cls, d)


@dataclass
class Secret:
    """A stored secret as the API shows it (`/v1/secrets`): its name, its
    owner, its value's length and when it was stored; never the value."""
    name: str
    bytes: int
    created_at: str
    #: The tenant whose key stored it (None: the operator's). A tenant's
    #: policies bind only its own, and its sessions get only its own.
    tenant: Optional[str] = None
    extra: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "Secret":
        return _from(cls, d)


@dataclass
class TenantKey:
    """A tenant's API key as listed: its id and display prefix, never the key."""
    id: str
    tenant: str
    prefix: str
    created_at: str
    revoked_at: Optional[str] = None
    extra: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "TenantKey":
        return _from(cls, d)


@dataclass
class CreatedKey:
    """A key just made: `key` is the bearer key, shown this once only."""
    id: str
    tenant: str
    prefix: str
    created_at: str
    key: str
    revoked_at: Optional[str] = None
    extra: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "CreatedKey":
        return _from(cls, d)


@dataclass
class BuildAccepted:
    build_id: str
    name: str
    version: str
    events_url: str
    extra: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "BuildAccepted":
        return _from(cls, d)


@dataclass
class BuildEvent:
    """`kind` is step, log, done or error; `data` the event's JSON."""
    kind: str
    data: Dict[str, Any]


@dataclass
class NetworkRule:
    """Exactly one of `cidr` and `host`; `ports` empty means every port."""
    cidr: Optional[str] = None
    host: Optional[str] = None
    ports: List[int] = field(default_factory=list)

    def to_dict(self) -> Dict[str, Any]:
        d: Dict[str, Any] = {"cidr": self.cidr} if self.cidr is not None else {"host": self.host}
        if self.ports:
            d["ports"] = list(self.ports)
        return d

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "NetworkRule":
        return cls(cidr=d.get("cidr"), host=d.get("host"), ports=list(d.get("ports") or []))


@dataclass
class NetworkPolicy:
    egress: str = "deny"
    allow: List[NetworkRule] = field(default_factory=list)
    deny: List[NetworkRule] = field(default_factory=list)

    def to_dict(self) -> Dict[str, Any]:
        return {"egress": self.egress, "allow": [r.to_dict() for r in self.allow],
                "deny": [r.to_dict() for r in self.deny]}

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "NetworkPolicy":
        return cls(egress=d.get("egress", "deny"), allow=[NetworkRule.from_dict(r) for r in d.get("allow") or []],
                   deny=[NetworkRule.from_dict(r) for r in d.get("deny") or []])


@dataclass
class NetworkEvent:
    time: str
    protocol: str
    destination: str
    # 1, 2, ... per sandbox in the order logged: a gap before the first
    # one kept is how many were dropped from the daemon's last 256.
    seq: int
    port: Optional[int] = None
    extra: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "NetworkEvent":
        return _from(cls, d)


# run_code ---------------------------------------------------------------

# MIME type -> the Result attribute that reads it (E2B's names).
MIME_ATTRS = {"text/plain": "text", "text/html": "html", "text/markdown": "markdown", "image/svg+xml": "svg",
              "image/png": "png", "image/jpeg": "jpeg", "application/pdf": "pdf", "text/latex": "latex",
              "application/json": "json", "application/javascript": "javascript"}


@dataclass
class Result:
    """One rich result of a cell: the MIME bundle `data` (``text/plain``
    always; ``text/html``, ``image/png`` (base64), ``application/json`` (a
    JSON value)... when the value offers them), readable as `.text`,
    `.html`, `.markdown`, `.svg`, `.png`, `.jpeg`, `.pdf`, `.latex`, `.json`
    and `.javascript` (None when absent). `is_main_result` is True for the
    value of the cell's last expression, False for a ``display()``."""
    data: Dict[str, Any]
    is_main_result: bool
    extra: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "Result":
        r = _from(cls, d)
        r.data = dict(r.data or {})
        return r

    def _str(self, mime: str) -> Optional[str]:
        v = self.data.get(mime)
        return v if isinstance(v, str) else None

    @property
    def text(self) -> Optional[str]:
        """text/plain"""
        return self._str("text/plain")

    @property
    def html(self) -> Optional[str]:
        """text/html"""
        return self._str("text/html")

    @property
    def markdown(self) -> Optional[str]:
        """text/markdown"""
        return self._str("text/markdown")

    @property
    def svg(self) -> Optional[str]:
        """image/svg+xml"""
        return self._str("image/svg+xml")

    @property
    def png(self) -> Optional[str]:
        """image/png, base64"""
        return self._str("image/png")

    @property
    def jpeg(self) -> Optional[str]:
        """image/jpeg, base64"""
        return self._str("image/jpeg")

    @property
    def pdf(self) -> Optional[str]:
        """application/pdf, base64"""
        return self._str("application/pdf")

    @property
    def latex(self) -> Optional[str]:
        """text/latex"""
        return self._str("text/latex")

    @property
    def json(self) -> Any:
        """application/json: a JSON value (dict, list...)"""
        return self.data.get("application/json")

    @property
    def javascript(self) -> Optional[str]:
        """application/javascript"""
        return self._str("application/javascript")

    def formats(self) -> List[str]:
        """The formats besides text: their attribute names (``html``,
        ``png``...), then any other MIME type as it is."""
        known = [a for m, a in MIME_ATTRS.items() if m != "text/plain" and self.data.get(m) is not None]
        return known + [m for m in self.data if m not in MIME_ATTRS]

    def __str__(self) -> str:
        return str(self.text) if self.text is not None else repr(self)

    # Displayed in a notebook the way the sandbox's value would be.
    def _repr_html_(self) -> Optional[str]:
        return self.html

    def _repr_markdown_(self) -> Optional[str]:
        return self.markdown

    def _repr_svg_(self) -> Optional[str]:
        return self.svg

    def _repr_png_(self) -> Optional[str]:
        return self.png

    def _repr_jpeg_(self) -> Optional[str]:
        return self.jpeg

    def _repr_latex_(self) -> Optional[str]:
        return self.latex

    def _repr_json_(self) -> Any:
        return self.json

    def _repr_javascript_(self) -> Optional[str]:
        return self.javascript


@dataclass
class ExecutionError:
    """The exception a cell raised: its class `name`, its `value` (the
    message) and the formatted `traceback`. `InterpreterDied` when the
    interpreter itself died."""
    name: str
    value: str
    traceback: str
    extra: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "ExecutionError":
        return _from(cls, d)


@dataclass
class Logs:
    """What the cell printed, as the chunks arrived."""
    stdout: List[str] = field(default_factory=list)
    stderr: List[str] = field(default_factory=list)


@dataclass
class Execution:
    """The outcome of `run_code`: `results` (rich results, the main one
    last), `logs`, `error` (None unless the cell raised), `execution_count`
    (the cell's number in its context), and Hatchery's accounting: `reason`
    (``exited`` when the cell ran to its end, with or without an error;
    else timeout, cpu_limit, oom, output_limit, cancelled...),
    `restarted` (the interpreter was replaced: its variables are gone),
    `truncated`, `duration_ms`, `cpu_ms`, `memory_peak_bytes`,
    `oom_killed` and `context_id`."""
    results: List[Result]
    logs: Logs
    context_id: str
    execution_count: int
    reason: ExecReason
    truncated: bool
    duration_ms: int
    cpu_ms: int
    restarted: bool
    oom_killed: bool
    error: Optional[ExecutionError] = None
    memory_peak_bytes: Optional[int] = None
    extra: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_summary(cls, summary: Dict[str, Any], results: List[Result], logs: Logs,
                     error: Optional[ExecutionError] = None) -> "Execution":
        """From the summary fields (the ``done`` event, or the whole
        response), the results and the logs."""
        d = dict(summary)
        for k in ("stdout", "stderr", "results"):
            d.pop(k, None)
        err = d.pop("error", None)
        d.update(results=results, logs=logs, error=ExecutionError.from_dict(err) if err else error)
        return _from(cls, d)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "Execution":
        logs = Logs([d["stdout"]] if d.get("stdout") else [], [d["stderr"]] if d.get("stderr") else [])
        return cls.from_summary(d, [Result.from_dict(r) for r in d.get("results") or []], logs)

    @property
    def text(self) -> Optional[str]:
        """text/plain of the main result (the cell's last expression)."""
        for r in self.results:
            if r.is_main_result:
                return r.text
        return None

    @property
    def ok(self) -> bool:
        """The cell ran to its end without raising."""
        return self.error is None and self.reason == "exited"


@dataclass
class CodeContext:
    """An interpreter with its own variables. `state` is ready, busy (a run
    in progress) or starting; ``default`` exists in every sandbox."""
    id: str
    language: str
    cwd: str
    state: str
    execution_count: int
    extra: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "CodeContext":
        return _from(cls, d)


ContextLike = Union[CodeContext, str]


def context_id(c: Optional[ContextLike]) -> Optional[str]:
    if c is None or isinstance(c, str):
        return c
    return c.id


PolicyLike = Union[NetworkPolicy, Dict[str, Any]]


def policy_dict(p: Optional[PolicyLike]) -> Optional[Dict[str, Any]]:
    if p is None:
        return None
    return p.to_dict() if isinstance(p, NetworkPolicy) else dict(p)


@dataclass
class PreviewUrl:
    """A signed URL a browser opens without the API key: `url` (absolute),
    `path` (``/preview/{token}/``), valid until `expires_at`, for `port` of
    `sandbox_id`."""
    url: str
    path: str
    expires_at: str
    sandbox_id: str
    port: int
    extra: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "PreviewUrl":
        return _from(cls, d)


@dataclass
class TerminalToken:
    """Opens one terminal of one sandbox, once, within a minute (``?token=``)."""
    token: str
    expires_at: str
    extra: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "TerminalToken":
        return _from(cls, d)


@dataclass
class TerminalExit:
    """How a terminal ended: the server's ``exit`` message (`exit_code`,
    `signal`, `reason`), or for a terminal the server closed otherwise
    (`closed` message or a dropped socket) `exit_code` None and `reason` the
    close reason."""
    exit_code: Optional[int]
    reason: str
    signal: Optional[int] = None
    close_code: Optional[int] = None
    message: Optional[str] = None
