// Typed errors. Every failure the daemon reports carries its stable `code`
// (e.g. "sandbox_not_found"), the human `message` and the HTTP `status`.

export interface ErrorInit {
  status?: number;
  code?: string;
  retryAfter?: number;
}

/** The extra fields of a 410 `sandbox_lost` body: which host, when, why. */
export interface LostDetail {
  host?: string;
  lost_at_ms?: number;
  reason?: string;
}

/** Base class of every error this SDK throws. */
export class HatcheryError extends Error {
  readonly status?: number;
  readonly code?: string;
  /** Seconds, from Retry-After (429 and 503). */
  readonly retryAfter?: number;

  constructor(message: string, init: ErrorInit = {}) {
    super(init.code ? `${init.code}: ${message}` : message);
    this.name = new.target.name;
    this.status = init.status;
    this.code = init.code;
    this.retryAfter = init.retryAfter;
  }
}

/** 400 or 415: the request failed validation. */
export class BadRequest extends HatcheryError {}
/** 401: missing or wrong API key. */
export class AuthError extends HatcheryError {}
/** 403: the guest refused a file operation. */
export class PermissionDenied extends HatcheryError {}
/** 404: no such sandbox, snapshot, template, build, file, cwd, code context (`context_not_found`) or background process (`process_not_found`). */
export class NotFound extends HatcheryError {}
/**
 * 410 `sandbox_lost`: the sandbox was stopped because its host was lost (no
 * heartbeat within the host lease); `host`, `lostAtMs` (unix ms) and `reason`
 * say which, when and why. A subclass of `NotFound`: code that treats a
 * vanished sandbox as gone keeps working.
 */
export class SandboxLost extends NotFound {
  readonly host?: string;
  readonly lostAtMs?: number;
  readonly reason?: string;

  constructor(message: string, init: ErrorInit = {}, detail: LostDetail = {}) {
    super(message, init);
    this.host = detail.host;
    this.lostAtMs = detail.lost_at_ms;
    this.reason = detail.reason;
  }
}
/** 409: sandbox not running, build already running, template in use, reading a directory, a 17th code context, writing to a closed stdin... */
export class Conflict extends HatcheryError {}
/** 413: body, file, code cell (256 KiB) or stdin write (1 MiB) over its limit, or no space left in the sandbox. */
export class TooLarge extends HatcheryError {}
/** 422: the guest failed the operation, or a snapshot image is corrupt. */
export class GuestError extends HatcheryError {}
/** 429: too many requests, e.g. `too_many` (a 17th running background process, or 4 MiB of stdin queued unread); `retryAfter` in seconds. */
export class RateLimited extends HatcheryError {}
/** 5xx: the daemon's own failure. */
export class ServerError extends HatcheryError {}
/** 503 `capacity` or `runtime_error`; `retryAfter` is set. */
export class ServiceUnavailable extends ServerError {}
/** 504 `guest_unresponsive`, or no answer within the client timeout. */
export class SandboxTimeout extends HatcheryError {}
/** The daemon could not be reached, or dropped the connection. */
export class ConnectionFailed extends HatcheryError {}
/** A server-sent event stream ended without its final event. */
export class StreamError extends HatcheryError {}
/** A template build ended with an `error` event. */
export class BuildFailed extends HatcheryError {}

const BY_STATUS: Record<number, typeof HatcheryError> = {
  400: BadRequest, 401: AuthError, 403: PermissionDenied, 404: NotFound, 409: Conflict, 413: TooLarge,
  415: BadRequest, 422: GuestError, 429: RateLimited, 503: ServiceUnavailable, 504: SandboxTimeout,
};

// The status each code is answered with outside a stream (docs/api.md), so an
// error arriving inside an SSE stream throws the same class.
const CODE_STATUS: Record<string, number> = {
  invalid_request: 400, invalid_json: 400, invalid_body: 400, invalid_query: 400, invalid_network_policy: 400,
  invalid_template_name: 400, unsupported_media_type: 415, unauthorized: 401, permission_denied: 403, not_found: 404,
  sandbox_not_found: 404, snapshot_not_found: 404, file_not_found: 404, template_not_found: 404, build_not_found: 404,
  context_not_found: 404, process_not_found: 404, sandbox_lost: 410, sandbox_not_running: 409, conflict: 409, file_conflict: 409, unsupported: 409,
  too_large: 413, guest_error: 422, snapshot_corrupt: 422, too_many: 429, capacity: 503, runtime_error: 503,
  network_exhausted: 503, guest_unresponsive: 504,
};

/** `detail`: the whole `error` object of the body (its extra fields). */
export function errorFor(
  status: number,
  code: string | undefined,
  message: string,
  retryAfter?: number,
  detail?: LostDetail,
): HatcheryError {
  if (status === 410 && code === "sandbox_lost") {
    return new SandboxLost(message, { status, code, retryAfter }, detail ?? {});
  }
  const cls = BY_STATUS[status] ?? (status >= 500 ? ServerError : HatcheryError);
  return new cls(message, { status, code, retryAfter });
}

export function errorFromEvent(payload: unknown): HatcheryError {
  const err = (payload as { error?: { code?: string; message?: string } & LostDetail } | null)?.error ?? {};
  return errorFor(CODE_STATUS[err.code ?? ""] ?? 500, err.code, err.message ?? "stream error", undefined, err);
}
