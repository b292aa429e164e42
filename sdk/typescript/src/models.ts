// The API's objects in camelCase. Each field map below is typed against the
// generated wire types (wire.ts, from docs/openapi.json): a field added to
// the API fails the build here until it is mapped, and the public types are
// derived from the maps, so they cannot drift either.
import type * as wire from "./wire.js";

type FieldMap<W> = { readonly [K in keyof Required<W>]: string };
type Renamed<W, M extends FieldMap<W>> = { [K in keyof W as M[K] & string]: W[K] };

function fromWire<W, M extends FieldMap<W>>(map: M, obj: W): Renamed<W, M> {
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(obj as Record<string, unknown>)) {
    out[k in map ? (map as Record<string, string>)[k] : k] = v;
  }
  return out as Renamed<W, M>;
}

/** Camel-case options -> a request body, dropping undefined values. */
export function toWire<W>(map: FieldMap<W>, opts: object): Partial<W> {
  const out: Record<string, unknown> = {};
  for (const [wireKey, camel] of Object.entries(map as Record<string, string>)) {
    const v = (opts as Record<string, unknown>)[camel];
    if (v !== undefined) out[wireKey] = v;
  }
  return out as Partial<W>;
}

export const SANDBOX_FIELDS = {
  id: "id", template: "template", state: "state", created_at: "createdAt", expires_at: "expiresAt",
  metadata: "metadata", boot_mode: "bootMode", boot_ms: "bootMs",
  // Lost sandboxes only (`list({ state: "lost" })`): with what host, when, why.
  host: "host", ended_at: "endedAt", end_reason: "endReason",
} as const satisfies FieldMap<wire.Sandbox>;
export type SandboxInfo = Renamed<wire.Sandbox, typeof SANDBOX_FIELDS>;
export const sandboxInfo = (w: wire.Sandbox): SandboxInfo => fromWire(SANDBOX_FIELDS, w);

/** Why a command (or a code run) ended. */
export type ExecReason = wire.ExecReason;

/** How output is put in JSON: `text` (UTF-8, invalid bytes as U+FFFD) or
 * `base64` (the exact bytes, which this SDK decodes into Uint8Arrays). */
export type OutputEncoding = wire.OutputEncoding;

/** `reason` says why the command ended; `contained` is true when every process
 * it started was killed with it and counted in `cpuMs`; `memoryPeakBytes` is
 * the largest memory use seen (sampled), when known; `hostCpuMs` is the CPU
 * the host spent on the whole sandbox meanwhile (null if it cannot tell). `stdoutBytes` /
 * `stderrBytes` are the exact bytes with `output: "base64"` (`stdout` /
 * `stderr` then hold their UTF-8 decoding); in text mode they are just
 * `stdout` / `stderr` encoded as UTF-8. */
export const EXEC_RESULT_FIELDS = {
  exit_code: "exitCode", stdout: "stdout", stderr: "stderr", timed_out: "timedOut", truncated: "truncated",
  oom_killed: "oomKilled", duration_ms: "durationMs", cpu_ms: "cpuMs", reason: "reason",
  memory_peak_bytes: "memoryPeakBytes", contained: "contained", host_cpu_ms: "hostCpuMs",
} as const satisfies FieldMap<wire.ExecResponse>;
export type ExecResult = Renamed<wire.ExecResponse, typeof EXEC_RESULT_FIELDS> & {
  stdoutBytes: Uint8Array;
  stderrBytes: Uint8Array;
};

/** Base64 -> bytes (a plain Uint8Array, not a pooled Buffer). */
export const fromBase64 = (s: string): Uint8Array => new Uint8Array(Buffer.from(s, "base64"));
const utf8 = new TextDecoder();
const utf8Encoder = new TextEncoder();
/** Bytes -> text, invalid sequences as U+FFFD (as the daemon's text mode does). */
export const decodeText = (b: Uint8Array): string => utf8.decode(b);
export const encodeText = (s: string): Uint8Array => utf8Encoder.encode(s);

export function execResult(w: wire.ExecResponse, output?: OutputEncoding): ExecResult {
  const r = fromWire(EXEC_RESULT_FIELDS, w) as ExecResult;
  if (output === "base64") {
    r.stdoutBytes = fromBase64(w.stdout);
    r.stderrBytes = fromBase64(w.stderr);
    r.stdout = decodeText(r.stdoutBytes);
    r.stderr = decodeText(r.stderrBytes);
  } else {
    r.stdoutBytes = encodeText(w.stdout);
    r.stderrBytes = encodeText(w.stderr);
  }
  return r;
}

// Background processes ------------------------------------------------------

export const PROCESS_INFO_FIELDS = {
  id: "id", pid: "pid", argv: "argv", started_at: "startedAt", state: "state", exit_code: "exitCode",
  signal: "signal", reason: "reason", cpu_ms: "cpuMs", output_bytes: "outputBytes", first_offset: "firstOffset",
  stdin_open: "stdinOpen", oom_killed: "oomKilled",
} as const satisfies FieldMap<wire.ProcessInfo>;
/** A background process. `id` (`proc_` + 16 hex digits) names it in its
 * sandbox; `pid` is its pid inside the sandbox; `state` is `running` or
 * `exited`. Once exited: `exitCode` (128+N when killed by signal N), `signal`
 * (the signal that ended it, if one did), `reason` (as for an exec:
 * exited, signaled, timeout, cancelled, oom...) and `oomKilled` (memory
 * ended it). stdout and stderr share one
 * offset space: `outputBytes` is the total so far, `firstOffset` the oldest
 * byte still kept (the last 1 MiB is). */
export type ProcessInfo = Renamed<wire.ProcessInfo, typeof PROCESS_INFO_FIELDS>;
export const processInfo = (w: wire.ProcessInfo): ProcessInfo => fromWire(PROCESS_INFO_FIELDS, w);

/** The payload of a process output event: the stream is the event's name. */
export const PROCESS_CHUNK_FIELDS = { data: "data", offset: "offset" } as const satisfies FieldMap<wire.ProcessChunk>;
/** A piece of a background process's output: `data` (text, or a Uint8Array
 * with `encoding: "base64"`), `offset` where its bytes start in the process's
 * output (stdout and stderr together) and `endOffset` just past them, where
 * to resume (exact with base64, and for valid UTF-8 text). */
export interface ProcessChunk<D extends string | Uint8Array = string> {
  stream: "stdout" | "stderr";
  data: D;
  offset: number;
  endOffset: number;
}

export const SIGNAL_FIELDS = { signal: "signal" } as const satisfies FieldMap<wire.SignalBody>;
/** A name (`SIGTERM`, `TERM`) or number from HUP INT QUIT KILL USR1 USR2 TERM CONT STOP WINCH. */
export type Signal = string | number;

export interface ProcessOutputOptions {
  /** First byte wanted (default 0: everything still kept, the last 1 MiB). */
  offset?: number;
  /** Keep going until the process exits (default true); false: the output so far. */
  follow?: boolean;
  /** `text` (default) or `base64` (chunks of Uint8Array). */
  encoding?: OutputEncoding;
}

export interface WaitOptions {
  /** How long to wait (default: as long as it takes). The API counts whole seconds: a fraction rounds up. */
  timeoutMs?: number;
  /** The same in seconds (give one of timeoutMs and timeoutSeconds). */
  timeoutSeconds?: number;
}

export const FILE_ENTRY_FIELDS = {
  name: "name", type: "type", size: "size", mode: "mode", mtime: "mtime",
} as const satisfies FieldMap<wire.FileEntry>;
export type FileEntry = Renamed<wire.FileEntry, typeof FILE_ENTRY_FIELDS>;
export const fileEntry = (w: wire.FileEntry): FileEntry => fromWire(FILE_ENTRY_FIELDS, w);

export const SNAPSHOT_FIELDS = {
  id: "id", sandbox_id: "sandboxId", template: "template", created_at: "createdAt", expires_at: "expiresAt",
  size_bytes: "sizeBytes", metadata: "metadata", memory: "memory",
} as const satisfies FieldMap<wire.Snapshot>;
export type SnapshotInfo = Renamed<wire.Snapshot, typeof SNAPSHOT_FIELDS>;
export const snapshotInfo = (w: wire.Snapshot): SnapshotInfo => fromWire(SNAPSHOT_FIELDS, w);

export const SNAPSHOT_POOL_FIELDS = {
  snapshot_id: "snapshotId", size: "size", ready: "ready", sandbox_ids: "sandboxIds",
} as const satisfies FieldMap<wire.SnapshotPool>;
/** A snapshot's warm pool on one host: forks kept restored and parked. */
export type SnapshotPool = Renamed<wire.SnapshotPool, typeof SNAPSHOT_POOL_FIELDS>;
export const snapshotPool = (w: wire.SnapshotPool): SnapshotPool => fromWire(SNAPSHOT_POOL_FIELDS, w);
export const SNAPSHOT_POOL_BODY_FIELDS = { size: "size" } as const satisfies FieldMap<wire.SnapshotPoolBody>;

export const TEMPLATE_FIELDS = {
  name: "name", version: "version", base: "base", packages: "packages", pip: "pip", files: "files", setup: "setup",
  cpus: "cpus", memory_mb: "memoryMb", pids_max: "pidsMax", disk_mb: "diskMb", checkpoint_ready: "checkpointReady",
  state: "state", build: "build",
} as const satisfies FieldMap<wire.TemplateInfo>;

/** A build in progress, as `TemplateInfo.build` shows it. */
export const BUILD_PROGRESS_FIELDS = {
  build_id: "buildId", version: "version", step: "step", percent: "percent", events_url: "eventsUrl",
} as const satisfies FieldMap<wire.BuildProgress>;
export type BuildProgress = Renamed<wire.BuildProgress, typeof BUILD_PROGRESS_FIELDS>;
/** `state`: `ready`, or `building` (no version is ready yet: creates answer
 * 503 `template_building`); `build`: the build in progress, if any. */
export type TemplateInfo = Omit<Renamed<wire.TemplateInfo, typeof TEMPLATE_FIELDS>, "build"> & {
  build?: BuildProgress | null;
};
export const templateInfo = (w: wire.TemplateInfo): TemplateInfo => ({
  ...fromWire(TEMPLATE_FIELDS, w),
  build: w.build ? fromWire(BUILD_PROGRESS_FIELDS, w.build) : w.build,
});

export const BUILD_ACCEPTED_FIELDS = {
  build_id: "buildId", name: "name", version: "version", events_url: "eventsUrl",
} as const satisfies FieldMap<wire.BuildAccepted>;
export type BuildAccepted = Renamed<wire.BuildAccepted, typeof BUILD_ACCEPTED_FIELDS>;
export const buildAccepted = (w: wire.BuildAccepted): BuildAccepted => fromWire(BUILD_ACCEPTED_FIELDS, w);

// Network policy objects pass through as they are: their field names are
// single words, the same in both cases (test/openapi.test.mjs checks that).
export type NetworkPolicy = wire.NetworkPolicy;
export type NetworkRule = wire.NetworkRule;
export type EgressMode = wire.EgressMode;
/** A denied connection attempt: `protocol` is tcp, udp, icmp or other. */
export type NetworkEvent = wire.EgressEventBody;
/** The exception a cell raised: its class `name`, its `value` (the message)
 * and the formatted `traceback` (`InterpreterDied` when the interpreter itself died). */
export type ExecutionError = wire.CodeError;
// Policy documents (docs/policy.md) pass through too: single-word fields.
export type PolicyDocument = wire.PolicyDocument;
export type PolicyRule = wire.Rule;
export const PASS_THROUGH = ["NetworkPolicy", "NetworkRule", "EgressEventBody", "CodeError",
  "PolicyDocument", "Rule", "Match", "ArgCondition", "NumberCondition"] as const;

export const STORED_POLICY_FIELDS = {
  id: "id", version: "version", created_at: "createdAt", sha256: "sha256", builtin: "builtin", document: "document",
  tenant: "tenant",
} as const satisfies FieldMap<wire.StoredPolicy>;
/** One immutable version of a policy. */
export type StoredPolicy = Renamed<wire.StoredPolicy, typeof STORED_POLICY_FIELDS>;
export const storedPolicy = (w: wire.StoredPolicy): StoredPolicy => fromWire(STORED_POLICY_FIELDS, w);

export const POLICY_SUMMARY_FIELDS = {
  id: "id", name: "name", latest_version: "latestVersion", created_at: "createdAt", updated_at: "updatedAt",
  builtin: "builtin", tenant: "tenant",
} as const satisfies FieldMap<wire.PolicySummary>;
export type PolicySummary = Renamed<wire.PolicySummary, typeof POLICY_SUMMARY_FIELDS>;
export const policySummary = (w: wire.PolicySummary): PolicySummary => fromWire(POLICY_SUMMARY_FIELDS, w);

// Tenants (docs/api.md, "Tenants"): operator key only ------------------------

export const LIMITS_FIELDS = {
  tokens: "tokens", usd_cents: "usdCents", concurrent_sessions: "concurrentSessions",
  live_sandboxes: "liveSandboxes", wall_clock_seconds: "wallClockSeconds",
} as const satisfies FieldMap<wire.Limits>;
/** A tenant's limits; an absent (or null) one is unlimited. */
export type Limits = Renamed<wire.Limits, typeof LIMITS_FIELDS>;

export const TENANT_FIELDS = {
  id: "id", name: "name", limits: "limits", created_at: "createdAt",
} as const satisfies FieldMap<wire.Tenant>;
export type Tenant = Omit<Renamed<wire.Tenant, typeof TENANT_FIELDS>, "limits"> & { limits: Limits };
export const tenant = (w: wire.Tenant): Tenant =>
  ({ ...fromWire(TENANT_FIELDS, w), limits: fromWire(LIMITS_FIELDS, w.limits) }) as Tenant;

export const TENANT_KEY_FIELDS = {
  id: "id", tenant: "tenant", prefix: "prefix", created_at: "createdAt", revoked_at: "revokedAt",
} as const satisfies FieldMap<wire.TenantKey>;
/** A tenant's key as listed: its id and display prefix, never the key. */
export type TenantKey = Renamed<wire.TenantKey, typeof TENANT_KEY_FIELDS>;
export const tenantKey = (w: wire.TenantKey): TenantKey => fromWire(TENANT_KEY_FIELDS, w);

export const CREATED_KEY_FIELDS = { ...TENANT_KEY_FIELDS, key: "key" } as const satisfies FieldMap<wire.CreatedKey>;
/** A key just made: `key` is the bearer key, shown this once only. */
export type CreatedKey = Renamed<wire.CreatedKey, typeof CREATED_KEY_FIELDS>;
export const createdKey = (w: wire.CreatedKey): CreatedKey => fromWire(CREATED_KEY_FIELDS, w);

export const NEW_TENANT_FIELDS = { name: "name", limits: "limits" } as const satisfies FieldMap<wire.NewTenant>;
export const TENANT_PATCH_FIELDS = { name: "name", limits: "limits" } as const satisfies FieldMap<wire.TenantPatch>;
/** Camel-case limits -> the wire's. */
export const limitsToWire = (l: Limits): wire.Limits => toWire<wire.Limits>(LIMITS_FIELDS, l);

// Secrets (docs/policy.md, "Credentials"): each key's own ------------------

export const SECRET_FIELDS = {
  name: "name", tenant: "tenant", bytes: "bytes", created_at: "createdAt",
} as const satisfies FieldMap<wire.SecretInfo>;
/** A stored secret as the API shows it: never its value. */
export type Secret = Renamed<wire.SecretInfo, typeof SECRET_FIELDS>;
export const secret = (w: wire.SecretInfo): Secret => fromWire(SECRET_FIELDS, w);
export const CREATE_SECRET_FIELDS = { name: "name", value: "value" } as const satisfies FieldMap<wire.CreateSecret>;

// run_code ----------------------------------------------------------------

export const CODE_CONTEXT_FIELDS = {
  id: "id", language: "language", cwd: "cwd", state: "state", execution_count: "executionCount",
} as const satisfies FieldMap<wire.CodeContext>;
/** An interpreter with its own variables; `state` is ready, busy (a run in
 * progress) or starting. `default` exists in every sandbox. */
export type CodeContext = Renamed<wire.CodeContext, typeof CODE_CONTEXT_FIELDS>;
export const codeContext = (w: wire.CodeContext): CodeContext => fromWire(CODE_CONTEXT_FIELDS, w);

export const CODE_RESULT_FIELDS = { data: "data", is_main_result: "isMainResult" } as const satisfies FieldMap<wire.CodeResultItem>;

/** MIME type -> the Result getter that reads it (E2B's names). */
export const MIME_FORMATS = {
  "text/plain": "text", "text/html": "html", "text/markdown": "markdown", "image/svg+xml": "svg", "image/png": "png",
  "image/jpeg": "jpeg", "application/pdf": "pdf", "text/latex": "latex", "application/json": "json",
  "application/javascript": "javascript",
} as const;

export interface Result extends Renamed<wire.CodeResultItem, typeof CODE_RESULT_FIELDS> {}
/** One rich result of a cell: the MIME bundle `data` (`text/plain` always;
 * `text/html`, `image/png` (base64), `application/json` (a JSON value)... when
 * the value offers them), readable as `text`, `html`, `markdown`, `svg`, `png`,
 * `jpeg`, `pdf`, `latex`, `json` and `javascript` (undefined when absent).
 * `isMainResult` is true for the value of the cell's last expression, false
 * for a `display()`. */
export class Result {
  constructor(w: wire.CodeResultItem) {
    Object.assign(this, fromWire(CODE_RESULT_FIELDS, w));
    this.data = { ...(w.data ?? {}) };
  }

  private str(mime: string): string | undefined {
    const v = this.data[mime];
    return typeof v === "string" ? v : undefined;
  }

  get text(): string | undefined { return this.str("text/plain"); }
  get html(): string | undefined { return this.str("text/html"); }
  get markdown(): string | undefined { return this.str("text/markdown"); }
  get svg(): string | undefined { return this.str("image/svg+xml"); }
  /** Base64. */
  get png(): string | undefined { return this.str("image/png"); }
  /** Base64. */
  get jpeg(): string | undefined { return this.str("image/jpeg"); }
  /** Base64. */
  get pdf(): string | undefined { return this.str("application/pdf"); }
  get latex(): string | undefined { return this.str("text/latex"); }
  /** A JSON value (object, array...). */
  get json(): unknown { return this.data["application/json"]; }
  get javascript(): string | undefined { return this.str("application/javascript"); }

  /** The formats besides text: their getter names (`html`, `png`...), then
   * any other MIME type as it is. */
  formats(): string[] {
    const known = Object.entries(MIME_FORMATS)
      .filter(([mime, name]) => name !== "text" && this.data[mime] !== undefined && this.data[mime] !== null)
      .map(([, name]) => name);
    return [...known, ...Object.keys(this.data).filter((m) => !(m in MIME_FORMATS))];
  }

  toString(): string {
    return this.text ?? "[Result]";
  }
}

/** What the cell printed, as the chunks arrived. */
export interface Logs {
  stdout: string[];
  stderr: string[];
}

export const CODE_SUMMARY_FIELDS = {
  context_id: "contextId", execution_count: "executionCount", reason: "reason", truncated: "truncated",
  duration_ms: "durationMs", cpu_ms: "cpuMs", memory_peak_bytes: "memoryPeakBytes", restarted: "restarted",
  oom_killed: "oomKilled", error: "error",
} as const satisfies FieldMap<wire.CodeSummary>;
/** Where each field of the non-streaming answer lands in an Execution. */
export const CODE_RESPONSE_FIELDS = {
  ...CODE_SUMMARY_FIELDS, results: "results", stdout: "logs", stderr: "logs",
} as const satisfies FieldMap<wire.CodeResponse>;
type Summary = Omit<Renamed<wire.CodeSummary, typeof CODE_SUMMARY_FIELDS>, "error">;

export interface Execution extends Summary {}
/** The outcome of runCode: `results` (rich results, the main one last),
 * `logs`, `error` (unless the cell raised: undefined), `executionCount` (the
 * cell's number in its context), and Hatchery's accounting: `reason` (`exited`
 * when the cell ran to its end, with or without an error; else timeout,
 * cpu_limit, oom, output_limit, cancelled...), `restarted` (the interpreter was
 * replaced: its variables are gone), `truncated`, `durationMs`, `cpuMs`,
 * `memoryPeakBytes`, `oomKilled` and `contextId`. */
export class Execution {
  results: Result[];
  logs: Logs;
  error?: ExecutionError;

  /** From the summary (the stream's `done` event, or the whole answer), the
   * results and the logs. */
  constructor(summary: wire.CodeSummary, results: Result[], logs: Logs, error?: ExecutionError) {
    const { error: e, ...rest } = fromWire(CODE_SUMMARY_FIELDS, summary);
    Object.assign(this, rest);
    this.results = results;
    this.logs = logs;
    const err = e ?? error;
    if (err) this.error = err;
  }

  static fromResponse(w: wire.CodeResponse): Execution {
    const { stdout, stderr, results, ...summary } = w;
    const logs = { stdout: stdout ? [stdout] : [], stderr: stderr ? [stderr] : [] };
    return new Execution(summary, (results ?? []).map((r) => new Result(r)), logs);
  }

  /** text/plain of the main result (the cell's last expression). */
  get text(): string | undefined {
    return this.results.find((r) => r.isMainResult)?.text;
  }

  /** The cell ran to its end without raising. */
  get ok(): boolean {
    return this.error === undefined && this.reason === "exited";
  }
}

// Request options: each map says which option carries each body field.

export interface CreateSandboxOptions {
  template?: string;
  ttlSeconds?: number;
  metadata?: Record<string, string>;
  env?: Record<string, string>;
  network?: NetworkPolicy;
}
export const CREATE_SANDBOX_FIELDS = {
  template: "template", ttl_seconds: "ttlSeconds", metadata: "metadata", env: "env", network: "network",
} as const satisfies FieldMap<wire.CreateSandbox> & Record<string, keyof CreateSandboxOptions>;

export interface ExecOptions {
  /** Run without a shell instead of `cmd` (argv[0] looked up on PATH). */
  argv?: string[];
  timeoutSeconds?: number;
  cwd?: string;
  env?: Record<string, string>;
  stdin?: string;
  /** Per-stream cap in bytes (default 1 MiB); a stream passing it ends the command (reason `output_limit`). */
  maxOutputBytes?: number;
  /** CPU time (1 to the timeout, in ms) after which everything the command started is killed (reason `cpu_limit`). */
  cpuLimitMs?: number;
  /** The clock `cpuLimitMs` is judged on: `guest` (default, the command's own CPU, `cpuMs`) or `host` (the
   * host's count for the whole sandbox, `hostCpuMs`: steadier on a busy host). Not with `background`. */
  cpuLimitBasis?: wire.CpuLimitBasis;
  /** `base64`: the exact bytes (`stdoutBytes` / `stderrBytes`; stream chunks of Uint8Array). Default `text`. */
  output?: OutputEncoding;
  /** Start it and resolve to a Process at once (only `exec`). It runs until it
   * exits, is killed, `timeoutSeconds` (if given) pass, or the sandbox goes. */
  background?: boolean;
}
export const EXEC_FIELDS = {
  cmd: "cmd", argv: "argv", timeout_seconds: "timeoutSeconds", cwd: "cwd", env: "env", stdin: "stdin",
  max_output_bytes: "maxOutputBytes", cpu_limit_ms: "cpuLimitMs", cpu_limit_basis: "cpuLimitBasis", output: "output",
  background: "background",
} as const satisfies FieldMap<wire.ExecBody> & Record<string, keyof (ExecOptions & { cmd?: string })>;

/** Callbacks may return a promise: it is awaited before the next event. */
export interface RunCodeOptions {
  /** `python` (the default). */
  language?: string;
  /** A context from createCodeContext, or its id; default: the sandbox's default context. */
  context?: CodeContext | string;
  onStdout?: (data: string) => unknown;
  onStderr?: (data: string) => unknown;
  onResult?: (result: Result) => unknown;
  onError?: (error: ExecutionError) => unknown;
  /** Set in os.environ for this run only. */
  envs?: Record<string, string>;
  /** Deadline (default 30 s); the API counts whole seconds, so it rounds up. */
  timeoutMs?: number;
  /** The same deadline in seconds (give one of timeoutMs and timeoutSeconds). */
  timeoutSeconds?: number;
  /** CPU time after which the cell is killed and the context restarted (reason `cpu_limit`). */
  cpuLimitMs?: number;
  /** Per stream, and for the rich results together (default 1 MiB). */
  maxOutputBytes?: number;
}
export const CODE_BODY_FIELDS = {
  code: "code", language: "language", context_id: "context", timeout_seconds: "timeoutSeconds",
  cpu_limit_ms: "cpuLimitMs", max_output_bytes: "maxOutputBytes", env: "envs",
} as const satisfies FieldMap<wire.CodeBody> & Record<string, keyof (RunCodeOptions & { code?: string })>;

export interface CreateCodeContextOptions {
  /** Working directory of the interpreter (default /workspace). */
  cwd?: string;
  /** `python` (the default). */
  language?: string;
}
export const CREATE_CONTEXT_FIELDS = {
  cwd: "cwd", language: "language",
} as const satisfies FieldMap<wire.CreateContext> & Record<string, keyof CreateCodeContextOptions>;

export const PATCH_FIELDS = { ttl_seconds: "ttlSeconds" } as const satisfies FieldMap<wire.PatchSandbox>;

export interface SnapshotOptions {
  retentionSeconds?: number;
  metadata?: Record<string, string>;
  /** `false`: the sandbox's files only (a filesystem-only pause). */
  memory?: boolean;
}
export const SNAPSHOT_OPTION_FIELDS = {
  retention_seconds: "retentionSeconds", metadata: "metadata", memory: "memory",
} as const satisfies FieldMap<wire.CreateSnapshot> & Record<string, keyof SnapshotOptions>;

export interface ForkOptions {
  ttlSeconds?: number;
  metadata?: Record<string, string>;
  network?: NetworkPolicy;
}
export const FORK_FIELDS = {
  count: "count", ttl_seconds: "ttlSeconds", metadata: "metadata", network: "network",
} as const satisfies FieldMap<wire.ForkBody> & Record<string, keyof (ForkOptions & { count?: number })>;

export interface TemplateSpec {
  name: string;
  base?: string;
  packages?: string[];
  /** Python requirements (`name==1.2`) installed into the rootfs by the host's pip. */
  pip?: string[];
  /** Absolute path -> content, written before setup. */
  files?: Record<string, string>;
  setup?: string[];
  cpus?: number;
  memoryMb?: number;
  pidsMax?: number;
  diskMb?: number;
  network?: NetworkPolicy;
}
export const TEMPLATE_SPEC_FIELDS = {
  name: "name", base: "base", packages: "packages", pip: "pip", files: "files", setup: "setup", cpus: "cpus",
  memory_mb: "memoryMb", pids_max: "pidsMax", disk_mb: "diskMb", network: "network",
} as const satisfies FieldMap<wire.CreateTemplate> & Record<string, keyof TemplateSpec>;

/** One piece of streamed output: text, or a Uint8Array with `output: "base64"`. */
export interface OutputChunk<D extends string | Uint8Array = string> {
  stream: "stdout" | "stderr";
  data: D;
}

export interface BuildEvent {
  kind: "step" | "log" | "done" | "error" | string;
  data: Record<string, unknown>;
}

export const PREVIEW_URL_FIELDS = {
  url: "url", path: "path", expires_at: "expiresAt", sandbox_id: "sandboxId", port: "port",
} as const satisfies FieldMap<wire.PreviewUrl>;
/** A signed URL a browser opens without the API key: `url` (absolute), `path`
 * (`/preview/{token}/`), valid until `expiresAt`, for `port` of `sandboxId`. */
export type PreviewUrl = Renamed<wire.PreviewUrl, typeof PREVIEW_URL_FIELDS>;
export const previewUrl = (w: wire.PreviewUrl): PreviewUrl => fromWire(PREVIEW_URL_FIELDS, w);

export interface PreviewUrlOptions {
  /** How long the URL works, 1..86400 seconds (default 3600). */
  ttlSeconds?: number;
}
export const CREATE_PREVIEW_URL_FIELDS = {
  ttl_seconds: "ttlSeconds",
} as const satisfies FieldMap<wire.CreatePreviewUrl> & Record<string, keyof PreviewUrlOptions>;

export const TERMINAL_TOKEN_FIELDS = { token: "token", expires_at: "expiresAt" } as const satisfies FieldMap<wire.TerminalToken>;
/** Opens one terminal of one sandbox, once, within a minute (`PtyOptions.token`). */
export type TerminalToken = Renamed<wire.TerminalToken, typeof TERMINAL_TOKEN_FIELDS>;
export const terminalToken = (w: wire.TerminalToken): TerminalToken => fromWire(TERMINAL_TOKEN_FIELDS, w);

export interface PtyOptions {
  /** Window size (default 80x24), 1..1000 each. */
  cols?: number;
  rows?: number;
  /** Run this through /bin/sh -c instead of the login shell. */
  cmd?: string;
  /** Run this argv instead of the login shell (not with cmd). */
  argv?: string[];
  /** Absolute starting directory (default /root). */
  cwd?: string;
  /** Extra environment for the program. */
  envs?: Record<string, string>;
  /** A token from `ptyToken()`, used instead of the API key. */
  token?: string;
  /** Handshake timeout (default 30000). */
  timeoutMs?: number;
}

/** How a terminal ended: the server's `exit` message (`exitCode`, `signal`,
 * `reason`), or, when the server closed it otherwise, `exitCode` null and
 * `reason` the close reason (`idle_timeout`, `sandbox_gone`...). */
export interface TerminalExit {
  exitCode: number | null;
  /** `exited`, `signaled`, `cancelled`, `timeout` or `oom`; for a closed terminal, the close reason. */
  reason: string;
  /** The program was killed for memory. */
  oomKilled?: boolean;
  signal?: number | null;
  closeCode?: number;
  message?: string;
}
