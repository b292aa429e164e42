// Policies: ordered rules for agent tool calls and egress, first match
// wins, default deny (docs/policy.md). Versions are immutable.
import { getDefaultClient } from "./client.js";
import { type PolicyDocument, type PolicySummary, type StoredPolicy, policySummary, storedPolicy } from "./models.js";
import type { WithClient } from "./sandbox.js";
import type * as wire from "./wire.js";

export class Policies {
  /** A new policy at version 1; a BadRequest's message names the first bad rule (index and id). */
  static async create(doc: PolicyDocument, opts: WithClient = {}): Promise<StoredPolicy> {
    const client = opts.client ?? getDefaultClient();
    return storedPolicy(await client.json<wire.StoredPolicy>("POST /v1/policies", {}, { json: doc }));
  }

  /** The next version; earlier versions (and sessions pinned to them) keep their rules. */
  static async addVersion(id: string, doc: PolicyDocument, opts: WithClient = {}): Promise<StoredPolicy> {
    const client = opts.client ?? getDefaultClient();
    return storedPolicy(await client.json<wire.StoredPolicy>("POST /v1/policies/{id}/versions", { id }, { json: doc }));
  }

  static async list(opts: WithClient = {}): Promise<PolicySummary[]> {
    const client = opts.client ?? getDefaultClient();
    return (await client.json<wire.PolicyList>("GET /v1/policies")).policies.map(policySummary);
  }

  /** The latest version. */
  static async get(id: string, opts: WithClient = {}): Promise<StoredPolicy> {
    const client = opts.client ?? getDefaultClient();
    return storedPolicy(await client.json<wire.StoredPolicy>("GET /v1/policies/{id}", { id }));
  }

  static async getVersion(id: string, version: number, opts: WithClient = {}): Promise<StoredPolicy> {
    const client = opts.client ?? getDefaultClient();
    return storedPolicy(
      await client.json<wire.StoredPolicy>("GET /v1/policies/{id}/versions/{version}", { id, version: String(version) }),
    );
  }
}
