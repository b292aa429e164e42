// Agent sessions: a coding agent working on a repository in a sandbox
// (/v1/sessions; docs/openapi-sessions.json).
//
//   const s = await Session.create({ repo: "https://git.example.com/acme/api.git", task: "Fix the flaky test" });
//   for await (const ev of s.events()) console.log(ev.seq, ev.type);  // reconnects with `after` itself
import { type Client, getDefaultClient } from "./client.js";
import { ConnectionFailed, HatcheryError, SandboxTimeout, ServiceUnavailable, StreamError } from "./errors.js";

export const FINAL_STATES = ["completed", "failed", "cancelled"] as const;

export interface SessionEvent {
  seq: number;
  at: string;
  actor: "user" | "agent" | "system";
  type: string;
  [field: string]: unknown;
}

export interface SessionInfo {
  session_id: string;
  state: string;
  repo: string;
  ref: string;
  task: string;
  policy_id: string;
  policy_version: number;
  template: string;
  /** The environment and version the session started from. */
  environment_id: string | null;
  environment_version: number | null;
  metadata: Record<string, string>;
  /** The tenant whose key created the session; absent for the operator's. */
  tenant?: string;
  budget: { tokens: number; usd_cents: number; wall_s: number };
  spend: { tokens: number; usd_cents: number; wall_s: number };
  pending_approval: { approval_id: string; action: string; details: string; state: string; created_at: string } | null;
  waiting: string | null;
  created_at: string;
  started_at: string | null;
  ended_at: string | null;
  reason: string | null;
  sandbox_id: string | null;
  snapshot_id: string | null;
  review_snapshot_id: string | null;
  last_seq: number;
}

export interface CreateSessionOptions {
  /** May be left out with `environmentId` (the environment's is used). */
  repo?: string;
  /** Start from this environment's current version. */
  environmentId?: string;
  task: string;
  ref?: string;
  policyId?: string;
  budget?: { tokens?: number; usd_cents?: number; wall_s?: number };
  idempotencyKey?: string;
  template?: string;
  agent?: { kind?: string; model_url?: string; model?: string; max_steps?: number; command?: string };
  env?: Record<string, string>;
  /** Labels kept with the session and copied to its sandboxes; on many hosts, `tenant` spreads one tenant's sessions. */
  metadata?: Record<string, string>;
  client?: Client;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const enc = encodeURIComponent;

function isEnd(ev: SessionEvent): boolean {
  return ev.type === "state_changed" && (FINAL_STATES as readonly string[]).includes(ev.to as string);
}

export class Session {
  constructor(public info: SessionInfo, readonly client: Client = getDefaultClient()) {}

  get id(): string {
    return this.info.session_id;
  }

  get state(): string {
    return this.info.state;
  }

  static async create(opts: CreateSessionOptions): Promise<Session> {
    const client = opts.client ?? getDefaultClient();
    const body: Record<string, unknown> = { task: opts.task };
    if (opts.repo !== undefined) body.repo = opts.repo;
    if (opts.environmentId !== undefined) body.environment_id = opts.environmentId;
    if (opts.ref !== undefined) body.ref = opts.ref;
    if (opts.policyId !== undefined) body.policy_id = opts.policyId;
    if (opts.budget !== undefined) body.budget = opts.budget;
    if (opts.idempotencyKey !== undefined) body.idempotency_key = opts.idempotencyKey;
    if (opts.template !== undefined) body.template = opts.template;
    if (opts.agent !== undefined) body.agent = opts.agent;
    if (opts.env !== undefined) body.env = opts.env;
    if (opts.metadata !== undefined) body.metadata = opts.metadata;
    // With an idempotency key a retry cannot make a second session.
    const r = await client.transport.json<{ session_id: string }>("POST", "/v1/sessions", {
      json: body,
      idempotent: opts.idempotencyKey !== undefined,
    });
    return Session.get(r.session_id, client);
  }

  static async get(id: string, client: Client = getDefaultClient()): Promise<Session> {
    const info = await client.transport.json<SessionInfo>("GET", `/v1/sessions/${enc(id)}`, { idempotent: true });
    return new Session(info, client);
  }

  /** Every session (all pages), oldest first. */
  static async list(opts: { state?: string; repo?: string; client?: Client } = {}): Promise<Session[]> {
    const client = opts.client ?? getDefaultClient();
    const out: Session[] = [];
    let after: string | undefined;
    for (;;) {
      const query: Array<[string, string]> = [["limit", "1000"]];
      if (opts.state) query.push(["state", opts.state]);
      if (opts.repo) query.push(["repo", opts.repo]);
      if (after) query.push(["after", after]);
      const page = await client.transport.json<{ sessions: SessionInfo[]; next_after: string | null }>(
        "GET", "/v1/sessions", { query, idempotent: true });
      out.push(...page.sessions.map((s) => new Session(s, client)));
      if (!page.next_after) return out;
      after = page.next_after;
    }
  }

  async refresh(): Promise<Session> {
    this.info = (await Session.get(this.id, this.client)).info;
    return this;
  }

  /** Steers the agent; resolves to the message's event seq. */
  async message(text: string): Promise<number> {
    const r = await this.client.transport.json<{ seq: number }>("POST", `/v1/sessions/${enc(this.id)}/messages`, {
      json: { text },
    });
    return r.seq;
  }

  /** `remember: "session"` (egress approvals only): the session's later
   * connections to the same host and port are not held again. */
  async approve(approvalId: string, note = "", opts: { remember?: "session" } = {}): Promise<number> {
    return this.decide(approvalId, "approve", note, opts.remember);
  }

  async deny(approvalId: string, note = "", opts: { remember?: "session" } = {}): Promise<number> {
    return this.decide(approvalId, "deny", note, opts.remember);
  }

  private async decide(approvalId: string, decision: string, note: string,
                       remember?: "session"): Promise<number> {
    const json: Record<string, unknown> = { decision, note };
    if (remember !== undefined) json.remember = remember;
    const r = await this.client.transport.json<{ seq: number }>(
      "POST", `/v1/sessions/${enc(this.id)}/approvals/${enc(approvalId)}`, { json });
    return r.seq;
  }

  /** Stops the agent (a snapshot is kept for review). Idempotent. */
  /** Moves the running session to another version of its policy (default:
   * the latest); its next egress connections use it. */
  async movePolicy(version?: number): Promise<Session> {
    this.info = await this.client.transport.json<SessionInfo>("POST", `/v1/sessions/${enc(this.id)}/policy`, {
      json: version === undefined ? {} : { version },
    });
    return this;
  }

  async cancel(): Promise<Session> {
    this.info = await this.client.transport.json<SessionInfo>("POST", `/v1/sessions/${enc(this.id)}:cancel`, {
      timeoutMs: Math.max(this.client.transport.timeoutMs, 120_000),
      idempotent: true,
    });
    return this;
  }

  async eventsPage(after = 0, limit = 100): Promise<{ events: SessionEvent[]; last_seq: number; has_more: boolean }> {
    return this.client.transport.json("GET", `/v1/sessions/${enc(this.id)}/events`, {
      query: [["after", String(after)], ["limit", String(limit)], ["format", "json"]],
      idempotent: true,
    });
  }

  /** Every event after `after`, in order, each once. Following, it ends
   * after the final state change; a dropped stream is reopened with
   * `after` = the last seq seen. `signal` stops it. */
  async *events(opts: { after?: number; follow?: boolean; signal?: AbortSignal; maxReconnects?: number } = {}):
    AsyncGenerator<SessionEvent> {
    let after = opts.after ?? 0;
    if (opts.follow === false) {
      for (;;) {
        const page = await this.eventsPage(after, 1000);
        for (const ev of page.events) {
          after = ev.seq;
          yield ev;
        }
        if (!page.has_more) return;
      }
    }
    const max = opts.maxReconnects ?? 100;
    let failures = 0;
    for (;;) {
      const ctl = new AbortController();
      const onAbort = () => ctl.abort();
      opts.signal?.addEventListener("abort", onAbort, { once: true });
      try {
        const sse = await this.client.transport.stream("GET", `/v1/sessions/${enc(this.id)}/events`, undefined,
          ctl.signal, [["after", String(after)]]);
        for await (const { data } of sse) {
          const ev = data as SessionEvent;
          if (ev.seq <= after) continue;
          after = ev.seq;
          failures = 0;
          yield ev;
          if (isEnd(ev)) return;
        }
      } catch (e) {
        if (opts.signal?.aborted) return;
        const retriable = e instanceof StreamError || e instanceof ConnectionFailed || e instanceof SandboxTimeout
          || e instanceof ServiceUnavailable;
        if (!retriable || ++failures > max) throw e;
        await sleep(Math.min(200 * failures, 2000));
        continue;
      } finally {
        opts.signal?.removeEventListener("abort", onAbort);
        ctl.abort();
      }
      if (opts.signal?.aborted) return;
      // Ended without the final event (the daemon restarted): reconnect
      // unless the session is over.
      await this.refresh();
      if ((FINAL_STATES as readonly string[]).includes(this.state) && after >= this.info.last_seq) return;
      if (++failures > max) throw new StreamError("event stream keeps ending early");
      await sleep(Math.min(200 * failures, 2000));
    }
  }

  /** Polls until the session is in one of `states`. */
  async wait(states: string | string[] = [...FINAL_STATES], timeoutMs = 600_000): Promise<Session> {
    const want = new Set(typeof states === "string" ? [states] : states);
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      await this.refresh();
      if (want.has(this.state)) return this;
      if ((FINAL_STATES as readonly string[]).includes(this.state)) {
        throw new HatcheryError(`session ${this.id} ended ${this.state}: ${this.info.reason}`);
      }
      if (Date.now() > deadline) throw new SandboxTimeout(`session ${this.id} still ${this.state}`);
      await sleep(250);
    }
  }
}
