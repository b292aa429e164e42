// Environments: a repository's set-up done once (/v1/environments;
// docs/openapi-sessions.json). `build()` runs the set-up in a sandbox with
// the set-up's own egress, closes it and snapshots a new version; sessions
// created with `environmentId` start from the current version.
//
//   const e = await Environment.create({ name: "api", repo, setup: "npm ci" });
//   await e.build((kind, data) => console.log(kind, data));
//   const s = await Session.create({ environmentId: e.id, task: "Fix the flaky test" });
import { type Client, getDefaultClient } from "./client.js";
import { HatcheryError, StreamError } from "./errors.js";

export interface EnvironmentVersion {
  version: number;
  snapshot_id: string;
  base_commit: string;
  template: string;
  /** The template's version the build started from (null: not recorded). */
  template_version: string | null;
  /** `template_changed`: the daemon rebuilt it after a template rebuild;
   * `snapshot_expiring`: before the previous version's snapshot reached
   * the end of its retention. */
  reason: BuildReason;
  built_at: string;
  build_ms: number;
}

export type BuildReason = "requested" | "template_changed" | "snapshot_expiring";

export interface EnvironmentInfo {
  environment_id: string;
  name: string;
  repo: string;
  ref: string;
  template: string;
  setup: string;
  setup_allow: Array<Record<string, unknown>>;
  setup_timeout_s: number;
  /** Sandboxes of the current version kept restored while it is hot (0: none). */
  pool_size: number;
  created_at: string;
  current: EnvironmentVersion | null;
  versions: EnvironmentVersion[];
  /** The template's version now (null: unreadable). */
  template_version: string | null;
  /** Built from an older template version; a rebuild is due or running,
   * sessions start from `current` until it is ready. */
  stale: boolean;
  building: boolean;
  building_reason: BuildReason | null;
  last_error: string | null;
}

export interface CreateEnvironmentOptions {
  name: string;
  repo: string;
  ref?: string;
  template?: string;
  setup?: string;
  /** NetworkPolicy allow rules open only while the set-up runs. */
  setupAllow?: Array<Record<string, unknown>>;
  setupTimeoutS?: number;
  /** 0..8 (default 2): sandboxes of the current version the host keeps
   * restored while the environment is hot, so a session claims one. */
  poolSize?: number;
  client?: Client;
}

const enc = encodeURIComponent;

export class Environment {
  constructor(public info: EnvironmentInfo, readonly client: Client = getDefaultClient()) {}

  get id(): string {
    return this.info.environment_id;
  }

  get version(): number | null {
    return this.info.current?.version ?? null;
  }

  static async create(opts: CreateEnvironmentOptions): Promise<Environment> {
    const client = opts.client ?? getDefaultClient();
    const body: Record<string, unknown> = { name: opts.name, repo: opts.repo, setup: opts.setup ?? "" };
    if (opts.ref !== undefined) body.ref = opts.ref;
    if (opts.template !== undefined) body.template = opts.template;
    if (opts.setupAllow !== undefined) body.setup_allow = opts.setupAllow;
    if (opts.setupTimeoutS !== undefined) body.setup_timeout_s = opts.setupTimeoutS;
    if (opts.poolSize !== undefined) body.pool_size = opts.poolSize;
    const info = await client.transport.json<EnvironmentInfo>("POST", "/v1/environments", { json: body });
    return new Environment(info, client);
  }

  static async get(id: string, client: Client = getDefaultClient()): Promise<Environment> {
    const info = await client.transport.json<EnvironmentInfo>("GET", `/v1/environments/${enc(id)}`, {
      idempotent: true,
    });
    return new Environment(info, client);
  }

  static async list(client: Client = getDefaultClient()): Promise<Environment[]> {
    const r = await client.transport.json<{ environments: EnvironmentInfo[] }>("GET", "/v1/environments", {
      idempotent: true,
    });
    return r.environments.map((e) => new Environment(e, client));
  }

  async refresh(): Promise<Environment> {
    this.info = (await Environment.get(this.id, this.client)).info;
    return this;
  }

  /** Builds a new version following its progress (`onEvent` gets each
   * `step` and `log`); resolves to the version. A failed set-up rejects
   * with the daemon's reason and makes no version. */
  async build(onEvent?: (kind: string, data: unknown) => void): Promise<number> {
    const ac = new AbortController();
    const sse = await this.client.transport.stream("POST", `/v1/environments/${enc(this.id)}:build`, undefined, ac.signal);
    try {
      for await (const ev of sse) {
        if (ev.event === "done") {
          await this.refresh();
          return (ev.data as { version: number }).version;
        }
        if (ev.event === "error") {
          const e = (ev.data as { error?: { code?: string; message?: string } }).error ?? {};
          throw new HatcheryError(e.message ?? "build failed", { code: e.code });
        }
        onEvent?.(ev.event, ev.data);
      }
    } finally {
      ac.abort();
    }
    throw new StreamError("the build's event stream ended before the build did");
  }

  /** Deletes it and its snapshots; refused (409) while sessions use it. */
  async delete(): Promise<void> {
    const r = await this.client.transport.request("DELETE", `/v1/environments/${enc(this.id)}`);
    await r.body?.cancel();
  }
}
