// Sandbox (with .filesystem and .network), ExecStream, Process (background
// processes) and ProcessOutput, Snapshot, Template.
import { Client, getDefaultClient, metadataQuery } from "./client.js";
import { BuildFailed, Conflict, ConnectionFailed, NotFound, SandboxTimeout, StreamError, errorFor, errorFromEvent } from "./errors.js";
import type { SSE, SSEEvent } from "./http.js";
import {
  type BuildAccepted, type BuildEvent, CODE_BODY_FIELDS, CREATE_CONTEXT_FIELDS, CREATE_SANDBOX_FIELDS,
  type CodeContext, type CreateCodeContextOptions, type CreateSandboxOptions, EXEC_FIELDS, type ExecOptions,
  type ExecReason, type ExecResult, Execution, type ExecutionError, FORK_FIELDS, type FileEntry, type ForkOptions,
  type Logs, type NetworkEvent, type NetworkPolicy, type OutputChunk, type OutputEncoding, PATCH_FIELDS,
  type ProcessChunk, type ProcessInfo, type ProcessOutputOptions, Result, type RunCodeOptions, SIGNAL_FIELDS,
  SNAPSHOT_OPTION_FIELDS, SNAPSHOT_POOL_BODY_FIELDS, type SandboxInfo, type Signal, type SnapshotInfo, type SnapshotOptions, type SnapshotPool,
  TEMPLATE_SPEC_FIELDS, type TemplateInfo, type TemplateSpec, type WaitOptions, buildAccepted, codeContext,
  decodeText, encodeText, execResult, fileEntry, fromBase64, processInfo, sandboxInfo, snapshotInfo, snapshotPool, templateInfo,
  toWire, CREATE_PREVIEW_URL_FIELDS, type PreviewUrl, type PreviewUrlOptions, type PtyOptions, type TerminalToken,
  previewUrl, terminalToken,
} from "./models.js";
import { Terminal } from "./terminal.js";
import type * as wire from "./wire.js";

/** Which client to use; default: one configured from the environment. */
export interface WithClient {
  client?: Client;
}

// Exec calls wait for the command: the HTTP timeout trails its deadline by the
// daemon's grace (kill 1 s after, give up 3 s after that) plus slack.
const EXEC_GRACE_MS = 15_000;
const DEFAULT_EXEC_TIMEOUT_S = 60;
const DEFAULT_CODE_TIMEOUT_S = 30;
// The daemon sends a keep-alive comment every 15 s on a silent stream.
const STREAM_IDLE_MS = 45_000;
// The longest wait the daemon accepts for a background process (seconds).
const MAX_WAIT_S = 300;

function concat(parts: Uint8Array[]): Uint8Array {
  return new Uint8Array(Buffer.concat(parts));
}

/** A stream's next event; a broken connection is a StreamError. */
async function nextEvent(events: AsyncIterator<SSEEvent>, what: string): Promise<IteratorResult<SSEEvent>> {
  try {
    return await events.next();
  } catch (e) {
    if (e instanceof StreamError || (e as Error)?.name === "SandboxTimeout") throw e;
    throw new StreamError(`${what} broken: ${(e as Error).message}`);
  }
}

function execBody(cmd: string | undefined, opts: ExecOptions): Partial<wire.ExecBody> {
  if ((cmd === undefined) === (opts.argv === undefined)) throw new TypeError("give exactly one of cmd and argv");
  return toWire<wire.ExecBody>(EXEC_FIELDS, { ...opts, cmd });
}

function codeBody(code: string, opts: RunCodeOptions): Partial<wire.CodeBody> {
  if (opts.timeoutMs !== undefined && opts.timeoutSeconds !== undefined) {
    throw new TypeError("give at most one of timeoutMs and timeoutSeconds");
  }
  // The API counts whole seconds: a fraction rounds up.
  const timeoutSeconds = opts.timeoutMs !== undefined ? Math.ceil(opts.timeoutMs / 1000) : opts.timeoutSeconds;
  const context = opts.context === undefined ? undefined : contextId(opts.context);
  return toWire<wire.CodeBody>(CODE_BODY_FIELDS, { ...opts, code, context, timeoutSeconds });
}

const contextId = (c: CodeContext | string): string => (typeof c === "string" ? c : c.id);

/** Chunk callbacks: text, or Uint8Array with `output: "base64"`. */
export interface StreamCallbacks<D extends string | Uint8Array = string> {
  onStdout?: (data: D) => void;
  onStderr?: (data: D) => void;
}

/** Output of a running command, as it comes. `for await` it for chunks, or
 * `await wait()`; either way `result` ends up holding the ExecResult (with the
 * whole stdout/stderr collected). `close()` kills the command. A stream that
 * ends without an exit event throws StreamError. With `output: "base64"` the
 * chunks are Uint8Arrays (an `ExecStream<Uint8Array>`). */
export class ExecStream<D extends string | Uint8Array = string> implements AsyncIterable<OutputChunk<D>> {
  result?: ExecResult;
  private readonly out = { stdout: [] as D[], stderr: [] as D[] };
  private readonly events: AsyncIterator<SSEEvent>;
  private idle?: NodeJS.Timeout;

  constructor(sse: SSE, private readonly abort: AbortController, private readonly cb: StreamCallbacks<D> = {},
              private readonly output?: OutputEncoding) {
    // Keep-alive comments count as activity: only a stream silent past
    // three of their intervals is dead.
    sse.onActivity = () => this.armIdle();
    this.events = sse[Symbol.asyncIterator]();
  }

  private armIdle(): void {
    clearTimeout(this.idle);
    this.idle = setTimeout(() => this.abort.abort(new StreamError("stream silent past the keep-alive interval")), STREAM_IDLE_MS);
    this.idle.unref();
  }

  async next(): Promise<IteratorResult<OutputChunk<D>>> {
    if (this.result) return { done: true, value: undefined };
    const raw = this.output === "base64";
    try {
      for (;;) {
        this.armIdle();
        const step = await nextEvent(this.events, "exec stream");
        if (step.done) throw new StreamError("exec stream ended without an exit event");
        const { event, data } = step.value;
        if (event === "stdout" || event === "stderr") {
          const text = (data as wire.OutputChunk).data;
          const chunk = (raw ? fromBase64(text) : text) as D;
          this.out[event].push(chunk);
          (event === "stdout" ? this.cb.onStdout : this.cb.onStderr)?.(chunk);
          return { done: false, value: { stream: event, data: chunk } };
        }
        if (event === "exit") {
          // The output came as events; the exit's own stdout/stderr are empty.
          const r = execResult(data as wire.ExecResponse, this.output);
          if (raw) {
            r.stdoutBytes = concat([...(this.out.stdout as Uint8Array[]), r.stdoutBytes]);
            r.stderrBytes = concat([...(this.out.stderr as Uint8Array[]), r.stderrBytes]);
            r.stdout = decodeText(r.stdoutBytes);
            r.stderr = decodeText(r.stderrBytes);
          } else {
            r.stdout = this.out.stdout.join("") + r.stdout;
            r.stderr = this.out.stderr.join("") + r.stderr;
            r.stdoutBytes = encodeText(r.stdout);
            r.stderrBytes = encodeText(r.stderr);
          }
          this.result = r;
          this.close();
          return { done: true, value: undefined };
        }
        if (event === "error") {
          this.close();
          throw errorFromEvent(data);
        }
      }
    } catch (e) {
      this.close();
      throw e;
    } finally {
      clearTimeout(this.idle);
    }
  }

  [Symbol.asyncIterator](): AsyncIterator<OutputChunk<D>> {
    return { next: () => this.next(), return: async () => { this.close(); return { done: true, value: undefined }; } };
  }

  async wait(): Promise<ExecResult> {
    while (!(await this.next()).done) { /* drain */ }
    return this.result!;
  }

  close(): void {
    clearTimeout(this.idle);
    if (!this.abort.signal.aborted) this.abort.abort();
  }
}

/** The output of a background process from some offset, as an async
 * iterator of ProcessChunks (connecting on the first `next()`, where HTTP
 * errors such as NotFound throw). Following (the default) it ends when the
 * process exits, otherwise once the output so far is read; either way `info`
 * then holds the process's info (its final one if it exited; the Process is
 * updated too) and `nextOffset` where to resume. `close()`, or leaving a
 * `for await` early, stops the reader, not the process. A stream that ends
 * without its final event throws StreamError. */
export class ProcessOutput<D extends string | Uint8Array = string> implements AsyncIterable<ProcessChunk<D>> {
  info?: ProcessInfo;
  nextOffset: number;
  private events?: AsyncIterator<SSEEvent>;
  private readonly abort = new AbortController();
  private idle?: NodeJS.Timeout;

  constructor(private readonly proc: Process, private readonly opts: ProcessOutputOptions = {}) {
    this.nextOffset = opts.offset ?? 0;
  }

  /** The stream ended with the process's exit (not just the output so far). */
  get exited(): boolean {
    return this.info !== undefined && this.info.state !== "running";
  }

  private armIdle(): void {
    clearTimeout(this.idle);
    this.idle = setTimeout(() => this.abort.abort(new StreamError("stream silent past the keep-alive interval")), STREAM_IDLE_MS);
    this.idle.unref();
  }

  private async open(): Promise<AsyncIterator<SSEEvent>> {
    const { offset = 0, follow = true, encoding = "text" } = this.opts;
    if (encoding !== "text" && encoding !== "base64") throw new TypeError(`encoding must be text or base64, not ${encoding}`);
    const query: Array<[string, string]> = [["offset", String(offset)], ["follow", String(follow)], ["encoding", encoding]];
    const sbx = this.proc.sandbox;
    const sse = await sbx.client.stream("GET /v1/sandboxes/{id}/processes/{pid}/output", { id: sbx.id, pid: this.proc.id },
      undefined, this.abort.signal, query);
    sse.onActivity = () => this.armIdle();
    return (this.events = sse[Symbol.asyncIterator]());
  }

  async next(): Promise<IteratorResult<ProcessChunk<D>>> {
    if (this.info || this.abort.signal.aborted) return { done: true, value: undefined };
    const raw = this.opts.encoding === "base64";
    try {
      const events = this.events ?? (await this.open());
      for (;;) {
        this.armIdle();
        const step = await nextEvent(events, "process output");
        if (step.done) throw new StreamError("process output ended without an exit or end event");
        const { event, data } = step.value;
        if (event === "stdout" || event === "stderr") {
          const w = data as wire.ProcessChunk;
          const bytes = raw ? fromBase64(w.data) : undefined;
          const endOffset = w.offset + (bytes ? bytes.length : Buffer.byteLength(w.data, "utf8"));
          this.nextOffset = Math.max(this.nextOffset, endOffset);
          return { done: false, value: { stream: event, data: (bytes ?? w.data) as D, offset: w.offset, endOffset } };
        }
        if (event === "exit" || event === "end") {
          this.info = this.proc.info = processInfo(data as wire.ProcessInfo);
          this.close();
          return { done: true, value: undefined };
        }
        if (event === "error") throw errorFromEvent(data);
      }
    } catch (e) {
      this.close();
      throw e;
    } finally {
      clearTimeout(this.idle);
    }
  }

  [Symbol.asyncIterator](): AsyncIterator<ProcessChunk<D>> {
    return { next: () => this.next(), return: async () => { this.close(); return { done: true, value: undefined }; } };
  }

  close(): void {
    clearTimeout(this.idle);
    if (!this.abort.signal.aborted) this.abort.abort();
  }
}

/** A background process (`sbx.exec(cmd, { background: true })`,
 * `sbx.processes()`, `sbx.process(id)`). `info` holds its fields as of the last
 * call that returned them (`refresh()` reads them again; wait, kill and signal
 * update them), also readable on the Process itself: `id` (`proc_...`, what
 * `sbx.process` takes back), `pid` (inside the sandbox), `state`, `exitCode`,
 * `reason`...; the signal that ended it is `info.signal` (`signal()` sends
 * one). `for await` over a Process follows its output from the start. */
export class Process implements AsyncIterable<ProcessChunk> {
  constructor(public info: ProcessInfo, readonly sandbox: Sandbox) {}

  /** `proc_` + 16 hex digits; names the process in its sandbox only. */
  get id(): string { return this.info.id; }
  /** Its pid inside the sandbox. */
  get pid(): number { return this.info.pid; }
  get argv(): string[] { return this.info.argv; }
  /** RFC 3339. */
  get startedAt(): string { return this.info.startedAt; }
  /** `running` or `exited`. */
  get state(): string { return this.info.state; }
  get running(): boolean { return this.info.state === "running"; }
  /** Once exited: its status (128+N when killed by signal N). */
  get exitCode(): number | null | undefined { return this.info.exitCode; }
  /** Once exited: why (exited, signaled, timeout, cpu_limit, cancelled...). */
  get reason(): ExecReason | null | undefined { return this.info.reason; }
  get cpuMs(): number { return this.info.cpuMs; }
  /** Output so far, stdout and stderr together. */
  get outputBytes(): number { return this.info.outputBytes; }
  /** The oldest offset still kept. */
  get firstOffset(): number { return this.info.firstOffset; }
  get stdinOpen(): boolean { return this.info.stdinOpen; }

  private get params(): Record<string, string> {
    return { id: this.sandbox.id, pid: this.id };
  }

  private update(w: wire.ProcessInfo): ProcessInfo {
    return (this.info = processInfo(w));
  }

  async refresh(): Promise<this> {
    this.update(await this.sandbox.client.json<wire.ProcessInfo>("GET /v1/sandboxes/{id}/processes/{pid}", this.params));
    return this;
  }

  /** Waits until the process has exited, or the timeout has passed (default:
   * as long as it takes), and resolves to its info: check `state` (still
   * `running` after a timeout) and `exitCode`. */
  async wait(opts: WaitOptions = {}): Promise<ProcessInfo> {
    if (opts.timeoutMs !== undefined && opts.timeoutSeconds !== undefined) {
      throw new TypeError("give at most one of timeoutMs and timeoutSeconds");
    }
    const timeoutMs = opts.timeoutMs ?? (opts.timeoutSeconds === undefined ? undefined : opts.timeoutSeconds * 1000);
    if (timeoutMs !== undefined && timeoutMs <= 0) return (await this.refresh()).info;
    const deadline = timeoutMs === undefined ? undefined : Date.now() + timeoutMs;
    let info: ProcessInfo | undefined;
    for (;;) {
      let secs = MAX_WAIT_S;
      if (deadline !== undefined) {
        const left = deadline - Date.now();
        if (info && left <= 100) return info;
        secs = Math.min(MAX_WAIT_S, Math.max(1, Math.ceil(left / 1000)));
      }
      // Waiting does nothing, so a dropped connection may be retried.
      info = this.update(await this.sandbox.client.json<wire.ProcessInfo>("POST /v1/sandboxes/{id}/processes/{pid}/wait",
        this.params, { query: [["timeout_seconds", String(secs)]], idempotent: true, timeoutMs: secs * 1000 + EXEC_GRACE_MS }));
      if (info.state !== "running") return info;
    }
  }

  /** Kills the process and everything it started (`reason` `cancelled`) and
   * resolves to its final info; for one that has exited, just its info. */
  async kill(): Promise<ProcessInfo> {
    return this.update(await this.sandbox.client.json<wire.ProcessInfo>("DELETE /v1/sandboxes/{id}/processes/{pid}", this.params));
  }

  /** Sends a signal to the process's group: a name (`SIGTERM`, `TERM`) or
   * number from HUP INT QUIT KILL USR1 USR2 TERM CONT STOP WINCH (others are
   * BadRequest). Resolves to its info right after. */
  async signal(signal: Signal): Promise<ProcessInfo> {
    const json = toWire<wire.SignalBody>(SIGNAL_FIELDS, { signal });
    return this.update(await this.sandbox.client.json<wire.ProcessInfo>("POST /v1/sandboxes/{id}/processes/{pid}/signal", this.params, { json }));
  }

  /** Writes to its stdin (a string as UTF-8), at most 1 MiB a call (TooLarge).
   * Conflict once stdin is closed; RateLimited while 4 MiB sit queued unread. */
  async sendStdin(data: string | Uint8Array): Promise<void> {
    const body = typeof data === "string" ? encodeText(data) : data;
    const r = await this.sandbox.client.call("POST /v1/sandboxes/{id}/processes/{pid}/stdin", this.params, {
      body, headers: { "content-type": "application/octet-stream" },
    });
    await r.body?.cancel();
  }

  /** Closes stdin once what is queued has been written (the process reads end of file). */
  async closeStdin(): Promise<void> {
    const r = await this.sandbox.client.call("POST /v1/sandboxes/{id}/processes/{pid}/stdin/close", this.params);
    await r.body?.cancel();
  }

  /** Its output from `offset` (default 0: all still kept, the last 1 MiB):
   * with `follow` (default) until it exits, else what there is so far.
   * `encoding: "base64"` gives chunks of Uint8Array. */
  output(opts: ProcessOutputOptions & { encoding: "base64" }): ProcessOutput<Uint8Array>;
  output(opts?: ProcessOutputOptions & { encoding?: "text" }): ProcessOutput<string>;
  output(opts: ProcessOutputOptions = {}): ProcessOutput<string> | ProcessOutput<Uint8Array> {
    return new ProcessOutput<string>(this, opts);
  }

  [Symbol.asyncIterator](): AsyncIterator<ProcessChunk> {
    return this.output()[Symbol.asyncIterator]();
  }
}

/** Files inside one sandbox; paths are absolute. */
export class Filesystem {
  constructor(private readonly sbx: Sandbox) {}

  private q(path: string): { query: Array<[string, string]> } {
    return { query: [["path", path]] };
  }

  /** Creates or truncates the file (mode 0644); missing parent directories are created. */
  async write(path: string, data: string | Uint8Array): Promise<void> {
    const body = typeof data === "string" ? new TextEncoder().encode(data) : data;
    const r = await this.sbx.client.call("PUT /v1/sandboxes/{id}/files", { id: this.sbx.id }, {
      ...this.q(path), body, headers: { "content-type": "application/octet-stream" },
    });
    await r.body?.cancel();
  }

  async read(path: string): Promise<Uint8Array> {
    const r = await this.sbx.client.call("GET /v1/sandboxes/{id}/files", { id: this.sbx.id }, this.q(path));
    return new Uint8Array(await r.arrayBuffer());
  }

  async readText(path: string): Promise<string> {
    return new TextDecoder().decode(await this.read(path));
  }

  async list(path = "/"): Promise<FileEntry[]> {
    const r = await this.sbx.client.json<wire.FileList>("GET /v1/sandboxes/{id}/files/list", { id: this.sbx.id }, this.q(path));
    return r.entries.map(fileEntry);
  }

  /** A file, a symlink, or a directory with everything in it. */
  async remove(path: string): Promise<void> {
    const r = await this.sbx.client.call("DELETE /v1/sandboxes/{id}/files", { id: this.sbx.id }, this.q(path));
    await r.body?.cancel();
  }

  async exists(path: string): Promise<boolean> {
    if (path === "/") return true;
    const trimmed = path.replace(/\/+$/, "");
    const i = trimmed.lastIndexOf("/");
    const parent = trimmed.slice(0, i) || "/";
    const name = trimmed.slice(i + 1);
    try {
      return (await this.list(parent)).some((e) => e.name === name);
    } catch (e) {
      if (e instanceof NotFound || e instanceof Conflict) return false;
      throw e;
    }
  }
}

/** The sandbox's egress policy and its log of denied connections. */
export class Network {
  constructor(private readonly sbx: Sandbox) {}

  get(): Promise<NetworkPolicy> {
    return this.sbx.client.json("GET /v1/sandboxes/{id}/network", { id: this.sbx.id });
  }

  update(policy: NetworkPolicy): Promise<NetworkPolicy> {
    return this.sbx.client.json("PUT /v1/sandboxes/{id}/network", { id: this.sbx.id }, { json: policy });
  }

  /** Denied attempts as the kernel logged them (rate-limited), oldest first. */
  async events(): Promise<NetworkEvent[]> {
    return (await this.sbx.client.json<wire.EgressEventList>("GET /v1/sandboxes/{id}/network/events", { id: this.sbx.id })).events;
  }

  /** Every new connection the policy refused, logged or not (exact); undefined when the daemon does not count. */
  async deniedTotal(): Promise<number | undefined> {
    const r = await this.sbx.client.json<wire.EgressEventList>("GET /v1/sandboxes/{id}/network/events", { id: this.sbx.id });
    return r.denied_total ?? undefined;
  }
}

/** A live sandbox. `info` holds its fields (template, state, expiresAt,
 * metadata, bootMode...). Supports `await using` (killed at scope end). */
/** Error codes of the daemon itself on the port routes (others come from the guest server). */
const DAEMON_PORT_ERRORS = new Set(["invalid_port", "port_closed", "bad_gateway", "too_many_connections",
  "sandbox_not_found", "sandbox_not_running", "guest_unresponsive", "unauthorized"]);

export class Sandbox {
  readonly filesystem: Filesystem;
  readonly files: Filesystem;
  readonly network: Network;

  constructor(public info: SandboxInfo, readonly client: Client = getDefaultClient()) {
    this.filesystem = new Filesystem(this);
    this.files = this.filesystem;
    this.network = new Network(this);
  }

  get id(): string {
    return this.info.id;
  }

  static async create(opts: CreateSandboxOptions & WithClient = {}): Promise<Sandbox> {
    const client = opts.client ?? getDefaultClient();
    const body = toWire<wire.CreateSandbox>(CREATE_SANDBOX_FIELDS, opts);
    return new Sandbox(sandboxInfo(await client.json<wire.Sandbox>("POST /v1/sandboxes", {}, { json: body })), client);
  }

  static async get(id: string, opts: WithClient = {}): Promise<Sandbox> {
    const client = opts.client ?? getDefaultClient();
    return new Sandbox(sandboxInfo(await client.json<wire.Sandbox>("GET /v1/sandboxes/{id}", { id })), client);
  }

  static connect = Sandbox.get;

  /** Creates a sandbox, runs `fn` with it and kills it afterwards, also when
   * `fn` throws: the try/finally of the README, in one call. */
  static async use<T>(opts: CreateSandboxOptions & WithClient, fn: (sbx: Sandbox) => Promise<T>): Promise<T> {
    const sbx = await Sandbox.create(opts);
    try {
      return await fn(sbx);
    } finally {
      await sbx.kill();
    }
  }

  static async list(opts: { metadata?: Record<string, string> } & WithClient = {}): Promise<Sandbox[]> {
    const client = opts.client ?? getDefaultClient();
    const r = await client.json<wire.SandboxList>("GET /v1/sandboxes", {}, { query: metadataQuery(opts.metadata) });
    return r.sandboxes.map((s) => new Sandbox(sandboxInfo(s), client));
  }

  async refresh(): Promise<this> {
    this.info = sandboxInfo(await this.client.json<wire.Sandbox>("GET /v1/sandboxes/{id}", { id: this.id }));
    return this;
  }

  async isRunning(): Promise<boolean> {
    try {
      return (await this.refresh()).info.state === "running";
    } catch (e) {
      if (e instanceof NotFound) return false;
      throw e;
    }
  }

  /** Idempotent: killing a sandbox that is already gone is fine. */
  async kill(): Promise<void> {
    const r = await this.client.call("DELETE /v1/sandboxes/{id}", { id: this.id });
    await r.body?.cancel();
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.kill();
  }

  /** The sandbox now expires `ttlSeconds` from now. */
  async setTtl(ttlSeconds: number): Promise<this> {
    const body = toWire<wire.PatchSandbox>(PATCH_FIELDS, { ttlSeconds });
    this.info = sandboxInfo(await this.client.json<wire.Sandbox>("PATCH /v1/sandboxes/{id}", { id: this.id }, { json: body }));
    return this;
  }

  /** Runs `cmd` with /bin/sh -c (or `opts.argv` without a shell, with `cmd`
   * undefined) and waits. A non-zero exit or a timeout is a result, not an
   * error. `output: "base64"` brings the exact bytes (`stdoutBytes` /
   * `stderrBytes`).
   *
   * With `background: true` it resolves at once to a Process, which runs
   * until it exits, is killed, `timeoutSeconds` (if given) pass, or the
   * sandbox goes; `stdin` is written to it and stdin stays open. At most 16
   * run at once per sandbox: the 17th throws RateLimited (`too_many`). */
  exec(cmd: string | undefined, opts: ExecOptions & { background: true }): Promise<Process>;
  exec(cmd: string | undefined, opts?: ExecOptions & { background?: false }): Promise<ExecResult>;
  exec(cmd: string | undefined, opts?: ExecOptions): Promise<ExecResult | Process>;
  async exec(cmd: string | undefined, opts: ExecOptions = {}): Promise<ExecResult | Process> {
    const json = execBody(cmd, opts);
    if (opts.background) {
      const w = await this.client.json<wire.ProcessInfo>("POST /v1/sandboxes/{id}/exec", { id: this.id }, { json });
      return new Process(processInfo(w), this);
    }
    const timeoutMs = (opts.timeoutSeconds ?? DEFAULT_EXEC_TIMEOUT_S) * 1000 + EXEC_GRACE_MS;
    const w = await this.client.json<wire.ExecResponse>("POST /v1/sandboxes/{id}/exec", { id: this.id }, { json, timeoutMs });
    return execResult(w, opts.output);
  }

  /** Starts `cmd` and returns its output stream; HTTP errors (404, 400...)
   * throw here. The same options as exec (not `background`); with
   * `output: "base64"`, chunks and callbacks get Uint8Arrays. */
  execStream(cmd: string | undefined, opts: ExecOptions & StreamCallbacks<Uint8Array> & { output: "base64" }): Promise<ExecStream<Uint8Array>>;
  execStream(cmd: string | undefined, opts?: ExecOptions & StreamCallbacks & { output?: "text" }): Promise<ExecStream>;
  async execStream(cmd: string | undefined, opts: ExecOptions & StreamCallbacks<any> = {}): Promise<ExecStream<any>> {
    if (opts.background) throw new TypeError("a background process is started with exec(cmd, { background: true }); read it with output()");
    const json = execBody(cmd, opts);
    const abort = new AbortController();
    const sse = await this.client.stream("POST /v1/sandboxes/{id}/exec/stream", { id: this.id }, json, abort.signal);
    return new ExecStream(sse, abort, opts, opts.output);
  }

  /** The sandbox's background processes: those running and the last 64 that exited. */
  async processes(): Promise<Process[]> {
    const r = await this.client.json<wire.ProcessList>("GET /v1/sandboxes/{id}/processes", { id: this.id });
    return r.processes.map((p) => new Process(processInfo(p), this));
  }

  /** A background process by its id (`proc_...`), e.g. to reconnect from
   * another program; NotFound (`process_not_found`) if the sandbox has none. */
  async process(id: string | Process): Promise<Process> {
    const pid = typeof id === "string" ? id : id.id;
    const w = await this.client.json<wire.ProcessInfo>("GET /v1/sandboxes/{id}/processes/{pid}", { id: this.id, pid });
    return new Process(processInfo(w), this);
  }

  /** Runs a cell in a stateful interpreter: the sandbox's default context
   * (already running), or `opts.context` (a CodeContext or its id). Variables
   * persist between calls in the same context. Past the timeout (default
   * 30 s) or `cpuLimitMs`, the cell is killed and the context restarted
   * (`reason` timeout / cpu_limit, `restarted` true). An exception in the cell
   * is `Execution.error`, not a rejection.
   *
   * With any callback given the output is streamed: onStdout / onStderr get
   * each chunk, onResult each Result, onError the ExecutionError, as they
   * happen; the promise still resolves to the whole Execution at the end. */
  async runCode(code: string, opts: RunCodeOptions = {}): Promise<Execution> {
    const json = codeBody(code, opts);
    if (!opts.onStdout && !opts.onStderr && !opts.onResult && !opts.onError) {
      const timeoutMs = (json.timeout_seconds ?? DEFAULT_CODE_TIMEOUT_S) * 1000 + EXEC_GRACE_MS;
      const w = await this.client.json<wire.CodeResponse>("POST /v1/sandboxes/{id}/code", { id: this.id }, { json, timeoutMs });
      return Execution.fromResponse(w);
    }
    const abort = new AbortController();
    const sse = await this.client.stream("POST /v1/sandboxes/{id}/code/stream", { id: this.id }, json, abort.signal);
    let idle: NodeJS.Timeout | undefined;
    const arm = () => {
      clearTimeout(idle);
      idle = setTimeout(() => abort.abort(new StreamError("stream silent past the keep-alive interval")), STREAM_IDLE_MS);
      idle.unref();
    };
    sse.onActivity = arm;
    const logs: Logs = { stdout: [], stderr: [] };
    const results: Result[] = [];
    let error: ExecutionError | undefined;
    try {
      arm();
      for await (const { event, data } of sse) {
        if (event === "stdout" || event === "stderr") {
          const chunk = (data as wire.OutputChunk).data;
          logs[event].push(chunk);
          await (event === "stdout" ? opts.onStdout : opts.onStderr)?.(chunk);
        } else if (event === "result") {
          const r = new Result(data as wire.CodeResultItem);
          results.push(r);
          await opts.onResult?.(r);
        } else if (event === "error") {
          error = data as wire.CodeError;
          await opts.onError?.(error);
        } else if (event === "done") {
          const ex = new Execution(data as wire.CodeSummary, results, logs, error);
          if (ex.error && !error) await opts.onError?.(ex.error);
          return ex;
        } else if (event === "failed") {
          throw errorFromEvent(data);
        }
      }
      throw new StreamError("code stream ended without a done event");
    } finally {
      clearTimeout(idle);
      // Also when a callback threw: closing the stream cancels the run.
      if (!abort.signal.aborted) abort.abort();
    }
  }

  /** A new interpreter with its own variables (at most 16 contexts per
   * sandbox: Conflict beyond). cwd default /workspace, language python. */
  async createCodeContext(opts: CreateCodeContextOptions = {}): Promise<CodeContext> {
    const json = toWire<wire.CreateContext>(CREATE_CONTEXT_FIELDS, opts);
    return codeContext(await this.client.json<wire.CodeContext>("POST /v1/sandboxes/{id}/code/contexts", { id: this.id }, { json }));
  }

  /** Every context of the sandbox, `default` included. */
  async listCodeContexts(): Promise<CodeContext[]> {
    const r = await this.client.json<wire.CodeContextList>("GET /v1/sandboxes/{id}/code/contexts", { id: this.id });
    return r.contexts.map(codeContext);
  }

  /** Replaces the context's interpreter with a clean one (its variables are
   * gone); `default` can be restarted too. */
  async restartCodeContext(context: CodeContext | string): Promise<CodeContext> {
    const timeoutMs = Math.max(this.client.transport.timeoutMs, 60_000);
    const params = { id: this.id, context_id: contextId(context) };
    return codeContext(await this.client.json<wire.CodeContext>("POST /v1/sandboxes/{id}/code/contexts/{context_id}/restart", params, { timeoutMs }));
  }

  /** Stops the context's interpreter; `default` cannot be removed (BadRequest). */
  async removeCodeContext(context: CodeContext | string): Promise<void> {
    const params = { id: this.id, context_id: contextId(context) };
    const r = await this.client.call("DELETE /v1/sandboxes/{id}/code/contexts/{context_id}", params);
    await r.body?.cancel();
  }

  private portPrefix(port: number): string {
    return `/v1/sandboxes/${encodeURIComponent(this.id)}/ports/${Math.trunc(port)}`;
  }

  /** The URL of `path` on the server listening on 127.0.0.1:`port` in the
   * sandbox, through the daemon. It needs the API key (as `Authorization:
   * Bearer`): for server-side use; give a browser `previewUrl` instead. */
  getUrl(port: number, opts: { path?: string } = {}): string {
    return `${this.client.url}${this.portPrefix(port)}/${(opts.path ?? "/").replace(/^\/+/, "")}`;
  }

  /** One HTTP request to the server on `port`, with the key: the guest
   * server's Response, whatever its status. The daemon's own refusals
   * (400 `invalid_port`, 502 `port_closed`, 429, 404...) throw. */
  async portRequest(port: number, opts: { method?: string; path?: string; body?: string | Uint8Array;
    headers?: Record<string, string>; timeoutMs?: number } = {}): Promise<Response> {
    const headers: Record<string, string> = { ...(opts.headers ?? {}) };
    if (this.client.transport.apiKey) headers.authorization = `Bearer ${this.client.transport.apiKey}`;
    const method = (opts.method ?? "GET").toUpperCase();
    const timeoutMs = opts.timeoutMs ?? this.client.transport.timeoutMs;
    let r: Response;
    try {
      r = await fetch(this.getUrl(port, { path: opts.path }), { method, headers, body: opts.body, signal: AbortSignal.timeout(timeoutMs) });
    } catch (e) {
      if (e instanceof Error && (e.name === "TimeoutError" || e.name === "AbortError")) {
        throw new SandboxTimeout(`no answer within ${timeoutMs} ms: ${method} port ${port}`);
      }
      throw new ConnectionFailed(`${method} port ${port}: ${(e as Error).message}`);
    }
    if (r.status >= 400 && (r.headers.get("content-type") ?? "").startsWith("application/json")) {
      const text = await r.clone().text();
      let err: { code?: string; message?: string } | undefined;
      try { err = JSON.parse(text).error; } catch { /* the guest's own */ }
      if (err?.code && DAEMON_PORT_ERRORS.has(err.code)) {
        const ra = Number(r.headers.get("retry-after") ?? NaN);
        throw errorFor(r.status, err.code, err.message ?? text, Number.isFinite(ra) ? ra : undefined);
      }
    }
    return r;
  }

  /** A signed URL (under /preview/{token}/) that serves `port` without the
   * API key until it expires (`ttlSeconds`, 1..86400, default 3600). */
  async previewUrl(port: number, opts: PreviewUrlOptions = {}): Promise<PreviewUrl> {
    const body = toWire<wire.CreatePreviewUrl>(CREATE_PREVIEW_URL_FIELDS, opts);
    return previewUrl(await this.client.json<wire.PreviewUrl>("POST /v1/sandboxes/{id}/ports/{port}/preview-url",
      { id: this.id, port: String(Math.trunc(port)) }, { json: body }));
  }

  /** A token that opens one terminal of this sandbox once, within 60 s (for a browser). */
  async ptyToken(): Promise<TerminalToken> {
    return terminalToken(await this.client.json<wire.TerminalToken>("POST /v1/sandboxes/{id}/pty/token", { id: this.id }));
  }

  /** Opens a terminal: the login shell, or `cmd` / `argv`, in a cols x rows
   * window. Closing it ends it and everything started in it. */
  async pty(opts: PtyOptions = {}): Promise<Terminal> {
    if (opts.cmd !== undefined && opts.argv !== undefined) throw new TypeError("give at most one of cmd and argv");
    const q = new URLSearchParams({ cols: String(opts.cols ?? 80), rows: String(opts.rows ?? 24) });
    if (opts.cwd !== undefined) q.set("cwd", opts.cwd);
    if (opts.cmd !== undefined) q.set("cmd", opts.cmd);
    if (opts.argv !== undefined) q.set("argv", JSON.stringify(opts.argv));
    if (opts.envs !== undefined) q.set("env", JSON.stringify(opts.envs));
    if (opts.token !== undefined) q.set("token", opts.token);
    const headers: Record<string, string> = { "user-agent": "hatchery-typescript/0.1.0" };
    if (opts.token === undefined && this.client.transport.apiKey) headers.authorization = `Bearer ${this.client.transport.apiKey}`;
    return Terminal.open(`${this.client.url}/v1/sandboxes/${encodeURIComponent(this.id)}/pty?${q}`, headers, opts.timeoutMs);
  }

  async snapshot(opts: SnapshotOptions = {}): Promise<Snapshot> {
    const json = toWire<wire.CreateSnapshot>(SNAPSHOT_OPTION_FIELDS, opts);
    const timeoutMs = Math.max(this.client.transport.timeoutMs, 120_000);
    const w = await this.client.json<wire.Snapshot>("POST /v1/sandboxes/{id}/snapshots", { id: this.id }, { json, timeoutMs });
    return new Snapshot(snapshotInfo(w), this.client);
  }
}

/** A saved state of a sandbox; fork it into new sandboxes. */
export class Snapshot {
  constructor(public info: SnapshotInfo, readonly client: Client = getDefaultClient()) {}

  get id(): string {
    return this.info.id;
  }

  static async get(id: string, opts: WithClient = {}): Promise<Snapshot> {
    const client = opts.client ?? getDefaultClient();
    return new Snapshot(snapshotInfo(await client.json<wire.Snapshot>("GET /v1/snapshots/{id}", { id })), client);
  }

  static async list(opts: { metadata?: Record<string, string> } & WithClient = {}): Promise<Snapshot[]> {
    const client = opts.client ?? getDefaultClient();
    const r = await client.json<wire.SnapshotList>("GET /v1/snapshots", {}, { query: metadataQuery(opts.metadata) });
    return r.snapshots.map((s) => new Snapshot(snapshotInfo(s), client));
  }

  /** Idempotent; the image files are gone when this resolves. */
  async delete(): Promise<void> {
    const r = await this.client.call("DELETE /v1/snapshots/{id}", { id: this.id });
    await r.body?.cancel();
  }

  /** This host's warm pool of the snapshot (size 0: none). */
  async pool(): Promise<SnapshotPool> {
    return snapshotPool(await this.client.json<wire.SnapshotPool>("GET /v1/snapshots/{id}/pool", { id: this.id }));
  }

  /**
   * Keeps `size` (0..8) forks restored and parked on the host, so that a
   * fork claims one instead of restoring; 0 drops the pool. The operator's
   * key only (a pool holds host memory).
   */
  async setPool(size: number): Promise<SnapshotPool> {
    const json = toWire<wire.SnapshotPoolBody>(SNAPSHOT_POOL_BODY_FIELDS, { size });
    return snapshotPool(await this.client.json<wire.SnapshotPool>("PUT /v1/snapshots/{id}/pool", { id: this.id }, { json }));
  }

  /** One new sandbox in the state the snapshot recorded. */
  async fork(opts: ForkOptions = {}): Promise<Sandbox> {
    return (await this.forkMany(1, opts))[0]!;
  }

  /** `count` (1..16) independent sandboxes; all or nothing. */
  async forkMany(count: number, opts: ForkOptions = {}): Promise<Sandbox[]> {
    const json = toWire<wire.ForkBody>(FORK_FIELDS, { ...opts, count });
    const timeoutMs = Math.max(this.client.transport.timeoutMs, 60_000 * count);
    const r = await this.client.json<wire.SandboxList>("POST /v1/snapshots/{id}/fork", { id: this.id }, { json, timeoutMs });
    return r.sandboxes.map((s) => new Sandbox(sandboxInfo(s), this.client));
  }
}

export interface BuildCallbacks {
  /** Each step: (percent, step); last (100, "done"). */
  onProgress?: (percent: number, step: string) => void;
  onLog?: (line: string) => void;
}

/** Templates: list, inspect, build (with progress) and delete. */
export class Template {
  static async list(opts: WithClient = {}): Promise<TemplateInfo[]> {
    const client = opts.client ?? getDefaultClient();
    return (await client.json<wire.TemplateList>("GET /v1/templates")).templates.map(templateInfo);
  }

  static async get(name: string, opts: WithClient = {}): Promise<TemplateInfo> {
    const client = opts.client ?? getDefaultClient();
    return templateInfo(await client.json<wire.TemplateInfo>("GET /v1/templates/{name}", { name }));
  }

  static async delete(name: string, opts: WithClient = {}): Promise<void> {
    const client = opts.client ?? getDefaultClient();
    const r = await client.call("DELETE /v1/templates/{name}", { name });
    await r.body?.cancel();
  }

  /** Starts a build and returns at once (202); follow it with buildEvents. */
  static async startBuild(spec: TemplateSpec, opts: WithClient = {}): Promise<BuildAccepted> {
    const client = opts.client ?? getDefaultClient();
    const json = toWire<wire.CreateTemplate>(TEMPLATE_SPEC_FIELDS, spec);
    return buildAccepted(await client.json<wire.BuildAccepted>("POST /v1/templates", {}, { json }));
  }

  /** Every event of the build from its start, ending after done or error;
   * throws StreamError if the stream ends otherwise. */
  static async *buildEvents(name: string, buildId: string, opts: WithClient = {}): AsyncGenerator<BuildEvent> {
    const client = opts.client ?? getDefaultClient();
    const abort = new AbortController();
    const sse = await client.stream("GET /v1/templates/{name}/builds/{id}/events", { name, id: buildId }, undefined, abort.signal);
    try {
      for await (const { event, data } of sse) {
        yield { kind: event, data: (data ?? {}) as Record<string, unknown> };
        if (event === "done" || event === "error") return;
      }
      throw new StreamError("build event stream ended without done or error");
    } finally {
      abort.abort();
    }
  }

  /** Builds and waits; resolves to the activated template, throws BuildFailed if the build fails. */
  static async build(spec: TemplateSpec, opts: BuildCallbacks & WithClient = {}): Promise<TemplateInfo> {
    const client = opts.client ?? getDefaultClient();
    const acc = await Template.startBuild(spec, { client });
    for await (const ev of Template.buildEvents(spec.name, acc.buildId, { client })) {
      if (ev.kind === "step") opts.onProgress?.(Number(ev.data.percent ?? 0), String(ev.data.step ?? ""));
      else if (ev.kind === "log") opts.onLog?.(String(ev.data.line ?? ""));
      else if (ev.kind === "done") opts.onProgress?.(100, "done");
      else if (ev.kind === "error") {
        const err = (ev.data.error ?? {}) as { code?: string; message?: string };
        throw new BuildFailed(err.message ?? "build failed", { code: err.code ?? "build_failed" });
      }
    }
    return Template.get(spec.name, { client });
  }
}
