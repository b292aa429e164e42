"""Plain data returned by the API, field for field as in the daemon's
OpenAPI document (docs/openapi.json; tests/test_openapi.py keeps them in
step). Fields the daemon adds later land in `extra` rather than being lost."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Dict, List, Optional, Type, TypeVar, Union

T = TypeVar("T", bound=Any)


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
    extra: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "SandboxInfo":
        return _from(cls, d)


@dataclass
class ExecResult:
    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool
    truncated: bool
    oom_killed: bool
    duration_ms: int
    cpu_ms: int
    extra: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "ExecResult":
        return _from(cls, d)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


@dataclass
class OutputChunk:
    """One piece of streamed output: `stream` is "stdout" or "stderr"."""
    stream: str
    data: str


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
    metadata: Dict[str, str] = field(default_factory=dict)
    extra: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "SnapshotInfo":
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
    extra: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "TemplateInfo":
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
    port: Optional[int] = None
    extra: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "NetworkEvent":
        return _from(cls, d)


PolicyLike = Union[NetworkPolicy, Dict[str, Any]]


def policy_dict(p: Optional[PolicyLike]) -> Optional[Dict[str, Any]]:
    if p is None:
        return None
    return p.to_dict() if isinstance(p, NetworkPolicy) else dict(p)
