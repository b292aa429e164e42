// Interview rounds (`/v1/rounds`, docs/interviews.md; wire shapes in
// docs/openapi-rounds.json).
//
//   const rnd = await Round.create({ name: "warmup", tests: { files }, cpuTimeLimitMs: 2000 });
//   const inv = await rnd.invite("ada@example.com");   // inv.url goes to the candidate
//   const s = await InterviewSession.connect(url, rnd.id, inv.id, inv.token!);  // token only
//   (await s.run({ "solution.py": code })).verdict;    // "ok", "time_limit", ...
import { type Client, getDefaultClient } from "./client.js";
import { StreamError, SandboxTimeout } from "./errors.js";
import { Transport } from "./http.js";

export type RunMode = "session" | "fresh";
export type Verdict = "ok" | "runtime_error" | "time_limit" | "wall_limit" | "memory_limit" | "output_limit";

export interface CreateRoundOptions {
  name: string;
  tests: { files: Record<string, string>; runner?: string[] };
  cpuTimeLimitMs: number;
  starterFiles?: Record<string, string>;
  template?: string;
  templateVersion?: string;
  run?: string[];
  wallTimeLimitMs?: number;
  memoryLimitMb?: number;
  outputLimitBytes?: number;
  runMode?: RunMode;
  setup?: { commands?: string[]; allow?: unknown[] };
  retentionSeconds?: number;
  sessionSeconds?: number;
  /** Files of a known-good solution: the round is refused (`limit_too_tight`) unless the CPU limit is 1.5x its worst run. */
  referenceSolution?: Record<string, string>;
  client?: Client;
}

export interface RoundInfo {
  id: string;
  name: string;
  state: "preparing" | "ready" | "failed" | "archived";
  template: string;
  template_version: string;
  /** The tenant whose key made the round; absent for the operator's. */
  tenant?: string;
  starter_files: Record<string, string>;
  run: string[];
  cpu_time_limit_ms: number;
  wall_time_limit_ms: number;
  memory_limit_mb: number;
  output_limit_bytes: number;
  run_mode: RunMode;
  retention_seconds: number;
  session_seconds: number;
  /** The most CPU the reference solution took at prepare time; null without one. */
  reference_cpu_ms: number | null;
  test_files: string[];
  custom_runner: boolean;
  created_at: string;
  error: string | null;
  [k: string]: unknown;
}

export interface CandidateResult {
  submission_id: string;
  passed: number;
  total: number;
  failed_cases: string[];
  status: string;
}

export interface SessionInfo {
  id: string;
  round_id: string;
  candidate: string;
  state: "preparing" | "ready" | "live" | "submitted" | "graded" | "ended";
  created_at: string;
  expires_at: string;
  result: CandidateResult | null;
  files: string[];
  run: string[];
  run_mode: RunMode;
  cpu_time_limit_ms: number;
  wall_time_limit_ms: number;
  round_name: string;
  error: string | null;
  token?: string;
  url?: string;
}

export interface RunResult {
  run_id: string;
  stdout: string;
  stderr: string;
  exit_code: number;
  cpu_ms: number;
  wall_ms: number;
  memory_peak_bytes: number;
  verdict: Verdict;
  reason: string;
  truncated: boolean;
  created_at: string;
}

export interface SubmitAccepted {
  submission_id: string;
  sha256: string;
  state: string;
}

export interface Replay {
  id: string;
  session_id: string;
  round_id: string;
  snapshot_id: string;
  reason: "end" | "on_demand";
  created_at: string;
  expires_at: string;
  state: "active" | "expired";
}

export type RunEvent =
  | { event: "stdout" | "stderr"; data: { data: string } }
  | { event: "result"; data: RunResult };

const q = encodeURIComponent;

function tokenTransport(url: string, token: string): Transport {
  // The token, never a key from the environment or the key file.
  return new Transport({ url, apiKey: token, keyFile: "/nonexistent" });
}

export class Round {
  constructor(
    public info: RoundInfo,
    private readonly t: Transport,
  ) {}

  get id(): string {
    return this.info.id;
  }
  get state(): string {
    return this.info.state;
  }

  /** POST /v1/rounds: prepares the round (setup included) before it answers. */
  static async create(o: CreateRoundOptions): Promise<Round> {
    const t = (o.client ?? getDefaultClient()).transport;
    const body: Record<string, unknown> = { name: o.name, tests: o.tests, cpu_time_limit_ms: o.cpuTimeLimitMs };
    const opt: [string, unknown][] = [
      ["starter_files", o.starterFiles], ["template", o.template], ["template_version", o.templateVersion],
      ["run", o.run], ["wall_time_limit_ms", o.wallTimeLimitMs], ["memory_limit_mb", o.memoryLimitMb],
      ["output_limit_bytes", o.outputLimitBytes], ["run_mode", o.runMode], ["setup", o.setup],
      ["retention_seconds", o.retentionSeconds], ["session_seconds", o.sessionSeconds],
      ["reference_solution", o.referenceSolution],
    ];
    for (const [k, v] of opt) if (v !== undefined) body[k] = v;
    return new Round(await t.json<RoundInfo>("POST", "/v1/rounds", { json: body, timeoutMs: 900_000 }), t);
  }

  /** With the API key (`client`), or a reviewer `token` (and `url`). */
  static async get(id: string, opts: { client?: Client; token?: string; url?: string } = {}): Promise<Round> {
    const t = opts.token
      ? tokenTransport(opts.url ?? (opts.client ?? getDefaultClient()).url, opts.token)
      : (opts.client ?? getDefaultClient()).transport;
    return new Round(await t.json<RoundInfo>("GET", `/v1/rounds/${q(id)}`, { idempotent: true }), t);
  }

  static async list(opts: { client?: Client } = {}): Promise<Round[]> {
    const t = (opts.client ?? getDefaultClient()).transport;
    const d = await t.json<{ rounds: RoundInfo[] }>("GET", "/v1/rounds", { idempotent: true });
    return d.rounds.map((r) => new Round(r, t));
  }

  async archive(): Promise<Round> {
    this.info = await this.t.json<RoundInfo>("POST", `/v1/rounds/${q(this.id)}/archive`);
    return this;
  }

  /** A candidate session: its sandbox, token and link. */
  async invite(candidate: string): Promise<InterviewSession> {
    const d = await this.t.json<SessionInfo>("POST", `/v1/rounds/${q(this.id)}/sessions`, {
      json: { candidate },
      timeoutMs: 180_000,
    });
    return new InterviewSession(d, this.t);
  }

  async sessions(): Promise<InterviewSession[]> {
    const d = await this.t.json<{ sessions: SessionInfo[] }>("GET", `/v1/rounds/${q(this.id)}/sessions`, {
      idempotent: true,
    });
    return d.sessions.map((s) => new InterviewSession(s, this.t));
  }

  /** {token, expires_at, url}: reads this round's sessions, reports and replays. */
  async reviewerToken(ttlSeconds?: number): Promise<{ token: string; expires_at: string; url: string }> {
    return this.t.json("POST", `/v1/rounds/${q(this.id)}/reviewer-tokens`, {
      json: ttlSeconds === undefined ? {} : { ttl_seconds: ttlSeconds },
    });
  }

  /** {token, expires_at, url}: opens this round's live rooms (read-only until pairing), the pairing switch and notes; no reports. */
  async interviewerToken(ttlSeconds?: number): Promise<{ token: string; expires_at: string; url: string }> {
    return this.t.json("POST", `/v1/rounds/${q(this.id)}/interviewer-tokens`, {
      json: ttlSeconds === undefined ? {} : { ttl_seconds: ttlSeconds },
    });
  }

  /** The caller's own fork of a replay (deny-all egress). */
  async forkReplay(replayId: string): Promise<ReplayFork> {
    const d = await this.t.json<{ id: string; sandbox_id: string }>(
      "POST",
      `/v1/rounds/${q(this.id)}/replays/${q(replayId)}/forks`,
      { timeoutMs: 180_000 },
    );
    return new ReplayFork(d, this.id, this.t);
  }
}

export class InterviewSession {
  /** The candidate token (only on the answer to an invite, or with `connect`). */
  readonly token?: string;
  readonly url?: string;

  constructor(
    public info: SessionInfo,
    private readonly t: Transport,
  ) {
    this.token = info.token;
    this.url = info.url;
  }

  /** As the candidate: only this session's token, never the API key. */
  static async connect(url: string, roundId: string, sessionId: string, token: string): Promise<InterviewSession> {
    const t = tokenTransport(url, token);
    const s = new InterviewSession({ id: sessionId, round_id: roundId, token } as SessionInfo, t);
    return s.refresh();
  }

  get id(): string {
    return this.info.id;
  }
  get roundId(): string {
    return this.info.round_id;
  }
  get state(): string {
    return this.info.state;
  }
  get result(): CandidateResult | null {
    return this.info.result ?? null;
  }

  private get base(): string {
    return `/v1/rounds/${q(this.roundId)}/sessions/${q(this.id)}`;
  }

  async refresh(): Promise<InterviewSession> {
    this.info = { ...(await this.t.json<SessionInfo>("GET", this.base, { idempotent: true })), token: this.token };
    return this;
  }

  async files(): Promise<Record<string, string>> {
    return (await this.t.json<{ files: Record<string, string> }>("GET", `${this.base}/files`, { idempotent: true }))
      .files;
  }

  async run(files: Record<string, string> = {}): Promise<RunResult> {
    return this.t.json<RunResult>("POST", `${this.base}/run`, { json: { files }, timeoutMs: 3_700_000 });
  }

  /** `stdout`/`stderr` as it runs, then `result`; an `error` event throws StreamError. */
  async *runStream(files: Record<string, string> = {}, signal?: AbortSignal): AsyncGenerator<RunEvent> {
    const sse = await this.t.stream("POST", `${this.base}/run/stream`, { files }, signal ?? new AbortController().signal);
    for await (const ev of sse) {
      if (ev.event === "error") {
        const e = (ev.data as { error?: { code?: string; message?: string } }).error ?? {};
        throw new StreamError(`${e.code}: ${e.message}`);
      }
      if (ev.event === "stdout" || ev.event === "stderr" || ev.event === "result") yield ev as RunEvent;
    }
  }

  async submit(files?: Record<string, string>): Promise<SubmitAccepted> {
    return this.t.json<SubmitAccepted>("POST", `${this.base}/submit`, {
      json: files === undefined ? {} : { files },
      timeoutMs: 180_000,
    });
  }

  /** Polls until the (given, else latest) submission is graded. */
  async waitGraded(submissionId?: string, timeoutMs = 600_000): Promise<CandidateResult> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      await this.refresh();
      const r = this.result;
      if (r && (!submissionId || r.submission_id === submissionId) && this.state !== "submitted") return r;
      if (Date.now() > deadline) throw new SandboxTimeout(`session ${this.id} not graded within ${timeoutMs} ms`);
      await new Promise((res) => setTimeout(res, 500));
    }
  }

  async terminal(): Promise<{ sandbox_id: string; token: string; expires_at: string }> {
    return this.t.json("POST", `${this.base}/terminal`);
  }

  /** A final replay, then the sandbox goes. */
  async end(): Promise<InterviewSession> {
    this.info = { ...(await this.t.json<SessionInfo>("POST", `${this.base}/end`, { timeoutMs: 180_000 })), token: this.token };
    return this;
  }

  // Reviewer side.
  async report(): Promise<Record<string, unknown>> {
    return this.t.json("GET", `${this.base}/report`, { idempotent: true });
  }
  async runs(): Promise<RunResult[]> {
    return (await this.t.json<{ runs: RunResult[] }>("GET", `${this.base}/runs`, { idempotent: true })).runs;
  }
  async regrade(submissionId: string): Promise<Record<string, unknown>> {
    return this.t.json("POST", `${this.base}/submissions/${q(submissionId)}/regrade`, { timeoutMs: 3_700_000 });
  }
  async replayNow(): Promise<Replay> {
    return this.t.json("POST", `${this.base}/replays`, { timeoutMs: 180_000 });
  }
  async replays(): Promise<Replay[]> {
    return (await this.t.json<{ replays: Replay[] }>("GET", `${this.base}/replays`, { idempotent: true })).replays;
  }
}

export class ReplayFork {
  constructor(
    public info: { id: string; sandbox_id: string },
    readonly roundId: string,
    private readonly t: Transport,
  ) {}

  get id(): string {
    return this.info.id;
  }
  private get base(): string {
    return `/v1/rounds/${q(this.roundId)}/forks/${q(this.id)}`;
  }
  async files(): Promise<string[]> {
    return (await this.t.json<{ files: string[] }>("GET", `${this.base}/files`, { idempotent: true })).files;
  }
  async read(path: string): Promise<string> {
    const d = await this.t.json<{ content: string }>("GET", `${this.base}/file`, {
      query: [["path", path]],
      idempotent: true,
    });
    return d.content;
  }
  async exec(argv: string[], timeoutSeconds = 30): Promise<{ stdout: string; stderr: string; exit_code: number }> {
    return this.t.json("POST", `${this.base}/exec`, { json: { argv, timeout_seconds: timeoutSeconds } });
  }
  async delete(): Promise<void> {
    await this.t.request("DELETE", this.base, { idempotent: true });
  }
}
