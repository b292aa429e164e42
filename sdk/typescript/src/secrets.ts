// Secrets for credential rules (docs/policy.md, "Credentials"): each key
// works on its own (a tenant key's are its tenant's; the operator key lists
// every owner's). A value is write-only: the egress proxy adds it to the
// requests a policy's credential rule names, and no route returns it.
import { getDefaultClient } from "./client.js";
import { type Secret, secret } from "./models.js";
import type { WithClient } from "./sandbox.js";
import type * as wire from "./wire.js";

export class Secrets {
  /** Stores `value` under `name` (Conflict, `secret_exists`, if taken). */
  static async create(name: string, value: string, opts: WithClient = {}): Promise<Secret> {
    const client = opts.client ?? getDefaultClient();
    const body: wire.CreateSecret = { name, value };
    return secret(await client.json<wire.SecretInfo>("POST /v1/secrets", {}, { json: body }));
  }

  static async list(opts: WithClient = {}): Promise<Secret[]> {
    const client = opts.client ?? getDefaultClient();
    return (await client.json<wire.SecretList>("GET /v1/secrets")).secrets.map(secret);
  }

  static async delete(name: string, opts: WithClient = {}): Promise<void> {
    const client = opts.client ?? getDefaultClient();
    const r = await client.call("DELETE /v1/secrets/{name}", { name });
    await r.body?.cancel();
  }
}
