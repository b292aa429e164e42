"""Hatchery SDK: disposable, isolated Linux sandboxes.

    from hatchery import Sandbox
    with Sandbox.create(ttl_seconds=120) as sbx:
        print(sbx.exec("python3 -c 'print(6*7)'").stdout)
        print(sbx.run_code("6 * 7").text)
        server = sbx.exec("python3 -m http.server 8000", background=True)
"""

from .client import (ROUTES, Client, ExecStream, Filesystem, Network, Policies, Process, ProcessOutput, Sandbox,
                     Secrets, Snapshot, Template, Tenants, Terminal, configure, default_client)
from .errors import (AuthError, BadRequest, BuildFailed, Conflict, ConnectionFailed, GuestError, HatcheryError,
                     NotFound, PermissionDenied, RateLimited, SandboxLost, SandboxTimeout, ServerError,
                     ServiceUnavailable, StreamError, TooLarge)
from .models import (BuildAccepted, BuildEvent, CodeContext, ExecReason, ExecResult, Execution, ExecutionError,
                     FileEntry, Logs, NetworkEvent, NetworkPolicy, NetworkRule, OutputChunk, OutputEncoding, CpuLimitBasis,
                     PreviewUrl, ProcessChunk, ProcessInfo, ProcessState, Result, SandboxInfo, SnapshotInfo, TemplateInfo,
                     TerminalExit, TerminalToken)
from .rounds import InterviewSession, ReplayFork, Round
from .models import CreatedKey, PolicySummary, Secret, SnapshotPool, StoredPolicy, Tenant, TenantKey
from .sessions import Environment, Session

__version__ = "0.1.0"

__all__ = [
    "Client", "Sandbox", "Snapshot", "Template", "Filesystem", "Network", "ExecStream", "Process", "ProcessOutput",
    "configure",
    "default_client", "ROUTES", "SnapshotPool",
    "HatcheryError", "BadRequest", "AuthError", "PermissionDenied", "NotFound", "SandboxLost", "Conflict", "TooLarge",
    "GuestError",
    "RateLimited", "ServerError", "ServiceUnavailable", "SandboxTimeout", "ConnectionFailed", "StreamError",
    "BuildFailed",
    "SandboxInfo", "ExecResult", "OutputChunk", "FileEntry", "SnapshotInfo", "TemplateInfo", "BuildAccepted",
    "BuildEvent", "NetworkPolicy", "NetworkRule", "NetworkEvent", "ExecReason",
    "Execution", "Result", "ExecutionError", "Logs", "CodeContext", "ProcessInfo", "ProcessChunk", "ProcessState",
    "OutputEncoding", "CpuLimitBasis", "Terminal", "PreviewUrl", "TerminalToken", "TerminalExit",
    "Round", "InterviewSession", "ReplayFork",
    "Policies", "StoredPolicy", "PolicySummary",
    "Tenants", "Tenant", "TenantKey", "CreatedKey", "Secrets", "Secret",
    "Session", "Environment",
]
