"""Typed errors. Every failure the daemon reports carries its stable `code`
(e.g. ``sandbox_not_found``), the human `message` and the HTTP `status`."""

from __future__ import annotations

from typing import Any, Optional


class HatcheryError(Exception):
    """Base class of every error this SDK raises."""

    def __init__(self, message: str, *, status: Optional[int] = None, code: Optional[str] = None,
                 retry_after: Optional[float] = None):
        super().__init__(message if code is None else f"{code}: {message}")
        self.message = message
        self.status = status
        self.code = code
        self.retry_after = retry_after


class BadRequest(HatcheryError):
    """400 or 415: the request failed validation."""


class AuthError(HatcheryError):
    """401: missing or wrong API key."""


class PermissionDenied(HatcheryError):
    """403: the guest refused a file operation."""


class NotFound(HatcheryError):
    """404: no such sandbox, snapshot, template, build, file, cwd, code
    context (``context_not_found``) or background process
    (``process_not_found``)."""


class SandboxLost(NotFound):
    """410 ``sandbox_lost``: the sandbox was stopped because its host was
    lost (no heartbeat within the host lease). `host`, `lost_at_ms` (unix
    ms) and `reason` say which, when and why. A subclass of `NotFound`:
    code that treats a vanished sandbox as gone keeps working."""

    def __init__(self, message: str, *, host: Optional[str] = None, lost_at_ms: Optional[int] = None,
                 reason: Optional[str] = None, **kw: Any):
        super().__init__(message, **kw)
        self.host = host
        self.lost_at_ms = lost_at_ms
        self.reason = reason


class Conflict(HatcheryError):
    """409: sandbox not running, build already running, template in use,
    reading a directory, a 17th code context, writing to a closed stdin..."""


class TooLarge(HatcheryError):
    """413: body, file, code cell (256 KiB) or stdin write (1 MiB) over its
    limit, or no space left in the sandbox."""


class GuestError(HatcheryError):
    """422: the guest failed the operation (``guest_error``), or a snapshot
    image is corrupt (``snapshot_corrupt``)."""


class RateLimited(HatcheryError):
    """429: too many requests, e.g. ``too_many`` (a 17th running background
    process, or 4 MiB of stdin queued unread); `retry_after` is in seconds
    (or None)."""


class ServerError(HatcheryError):
    """5xx: the daemon's own failure (or a capacity/runtime 503)."""


class ServiceUnavailable(ServerError):
    """503: ``capacity`` or ``runtime_error``; `retry_after` is set."""


class SandboxTimeout(HatcheryError):
    """504 ``guest_unresponsive``, or no answer within the client timeout."""


class ConnectionFailed(HatcheryError):
    """The daemon could not be reached, or dropped the connection."""


class StreamError(HatcheryError):
    """A server-sent event stream ended without its final event."""


class BuildFailed(HatcheryError):
    """A template build ended with an ``error`` event."""


_BY_STATUS = {400: BadRequest, 401: AuthError, 403: PermissionDenied, 404: NotFound, 409: Conflict,
              413: TooLarge, 415: BadRequest, 422: GuestError, 429: RateLimited, 503: ServiceUnavailable,
              504: SandboxTimeout}


def error_for(status: int, code: Optional[str], message: str, retry_after: Optional[float] = None,
              detail: Optional[dict] = None) -> HatcheryError:
    """`detail`: the whole ``error`` object of the body (its extra fields,
    such as a lost sandbox's ``host``, ``lost_at_ms`` and ``reason``)."""
    if status == 410 and code == "sandbox_lost":
        d = detail or {}
        return SandboxLost(message, status=status, code=code, retry_after=retry_after, host=d.get("host"),
                           lost_at_ms=d.get("lost_at_ms"), reason=d.get("reason"))
    cls = _BY_STATUS.get(status)
    if cls is None:
        cls = ServerError if status >= 500 else HatcheryError
    return cls(message, status=status, code=code, retry_after=retry_after)


def error_from_event(payload: Any, status: Optional[int] = None) -> HatcheryError:
    """An ``error`` event of a stream: ``{"error": {"code", "message"}}``."""
    err = (payload or {}).get("error") or {}
    code = err.get("code")
    status = status or _CODE_STATUS.get(code or "", 500)
    return error_for(status, code, err.get("message", "stream error"), detail=err)


# Status a code is answered with outside a stream (docs/api.md), so that an
# error arriving inside an SSE stream raises the same type.
_CODE_STATUS = {"invalid_request": 400, "invalid_json": 400, "invalid_body": 400, "invalid_query": 400,
                "invalid_network_policy": 400, "invalid_template_name": 400, "unsupported_media_type": 415,
                "unauthorized": 401, "permission_denied": 403, "not_found": 404, "sandbox_not_found": 404,
                "snapshot_not_found": 404, "file_not_found": 404, "template_not_found": 404, "build_not_found": 404,
                "context_not_found": 404, "process_not_found": 404, "sandbox_lost": 410, "sandbox_not_running": 409, "conflict": 409,
                "file_conflict": 409, "unsupported": 409, "too_large": 413, "guest_error": 422,
                "snapshot_corrupt": 422, "too_many": 429, "capacity": 503, "runtime_error": 503,
                "network_exhausted": 503, "guest_unresponsive": 504}
