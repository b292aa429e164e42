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
} as const satisfies FieldMap<wire.Sandbox>;
export type SandboxInfo = Renamed<wire.Sandbox, typeof SANDBOX_FIELDS>;
export const sandboxInfo = (w: wire.Sandbox): SandboxInfo => fromWire(SANDBOX_FIELDS, w);

export const EXEC_RESULT_FIELDS = {
  exit_code: "exitCode", stdout: "stdout", stderr: "stderr", timed_out: "timedOut", truncated: "truncated",
  oom_killed: "oomKilled", duration_ms: "durationMs", cpu_ms: "cpuMs",
} as const satisfies FieldMap<wire.ExecResponse>;
export type ExecResult = Renamed<wire.ExecResponse, typeof EXEC_RESULT_FIELDS>;
export const execResult = (w: wire.ExecResponse): ExecResult => fromWire(EXEC_RESULT_FIELDS, w);

export const FILE_ENTRY_FIELDS = {
  name: "name", type: "type", size: "size", mode: "mode", mtime: "mtime",
} as const satisfies FieldMap<wire.FileEntry>;
export type FileEntry = Renamed<wire.FileEntry, typeof FILE_ENTRY_FIELDS>;
export const fileEntry = (w: wire.FileEntry): FileEntry => fromWire(FILE_ENTRY_FIELDS, w);

export const SNAPSHOT_FIELDS = {
  id: "id", sandbox_id: "sandboxId", template: "template", created_at: "createdAt", expires_at: "expiresAt",
  size_bytes: "sizeBytes", metadata: "metadata",
} as const satisfies FieldMap<wire.Snapshot>;
export type SnapshotInfo = Renamed<wire.Snapshot, typeof SNAPSHOT_FIELDS>;
export const snapshotInfo = (w: wire.Snapshot): SnapshotInfo => fromWire(SNAPSHOT_FIELDS, w);

export const TEMPLATE_FIELDS = {
  name: "name", version: "version", base: "base", packages: "packages", files: "files", setup: "setup",
  cpus: "cpus", memory_mb: "memoryMb", pids_max: "pidsMax", disk_mb: "diskMb", checkpoint_ready: "checkpointReady",
} as const satisfies FieldMap<wire.TemplateInfo>;
export type TemplateInfo = Renamed<wire.TemplateInfo, typeof TEMPLATE_FIELDS>;
export const templateInfo = (w: wire.TemplateInfo): TemplateInfo => fromWire(TEMPLATE_FIELDS, w);

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
export const PASS_THROUGH = ["NetworkPolicy", "NetworkRule", "EgressEventBody"] as const;

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
  maxOutputBytes?: number;
}
export const EXEC_FIELDS = {
  cmd: "cmd", argv: "argv", timeout_seconds: "timeoutSeconds", cwd: "cwd", env: "env", stdin: "stdin",
  max_output_bytes: "maxOutputBytes",
} as const satisfies FieldMap<wire.ExecBody> & Record<string, keyof (ExecOptions & { cmd?: string })>;

export const PATCH_FIELDS = { ttl_seconds: "ttlSeconds" } as const satisfies FieldMap<wire.PatchSandbox>;

export interface SnapshotOptions {
  retentionSeconds?: number;
  metadata?: Record<string, string>;
}
export const SNAPSHOT_OPTION_FIELDS = {
  retention_seconds: "retentionSeconds", metadata: "metadata",
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
  name: "name", base: "base", packages: "packages", files: "files", setup: "setup", cpus: "cpus",
  memory_mb: "memoryMb", pids_max: "pidsMax", disk_mb: "diskMb", network: "network",
} as const satisfies FieldMap<wire.CreateTemplate> & Record<string, keyof TemplateSpec>;

export interface OutputChunk {
  stream: "stdout" | "stderr";
  data: string;
}

export interface BuildEvent {
  kind: "step" | "log" | "done" | "error" | string;
  data: Record<string, unknown>;
}
