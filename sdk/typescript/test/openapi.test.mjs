// The SDK against the daemon's OpenAPI document, committed and live. The
// build already fails if a documented route or field is not mapped (the maps
// are typed against src/wire.ts); these tests fail if wire.ts is stale, and
// check the maps at run time too.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import { ROUTES, fields } from "../dist/index.js";
import { generate } from "../scripts/gen-wire.mjs";
import { client } from "./helpers.mjs";

const here = dirname(fileURLToPath(import.meta.url));
const DOC = join(here, "../../../docs/openapi.json");
const WIRE = readFileSync(join(here, "../src/wire.ts"), "utf8");
const AHEAD = new Set();
const UNDOCUMENTED = new Set(["GET /openapi.json"]);
const MAPS = {
  Sandbox: fields.SANDBOX_FIELDS, ExecResponse: fields.EXEC_RESULT_FIELDS, FileEntry: fields.FILE_ENTRY_FIELDS,
  Snapshot: fields.SNAPSHOT_FIELDS, TemplateInfo: fields.TEMPLATE_FIELDS, BuildAccepted: fields.BUILD_ACCEPTED_FIELDS,
  CreateSandbox: fields.CREATE_SANDBOX_FIELDS, ExecBody: fields.EXEC_FIELDS, PatchSandbox: fields.PATCH_FIELDS,
  CreateSnapshot: fields.SNAPSHOT_OPTION_FIELDS, ForkBody: fields.FORK_FIELDS, CreateTemplate: fields.TEMPLATE_SPEC_FIELDS,
  CodeContext: fields.CODE_CONTEXT_FIELDS, CodeResultItem: fields.CODE_RESULT_FIELDS, CodeSummary: fields.CODE_SUMMARY_FIELDS,
  CodeResponse: fields.CODE_RESPONSE_FIELDS, CodeBody: fields.CODE_BODY_FIELDS, CreateContext: fields.CREATE_CONTEXT_FIELDS,
  ProcessInfo: fields.PROCESS_INFO_FIELDS, ProcessChunk: fields.PROCESS_CHUNK_FIELDS, SignalBody: fields.SIGNAL_FIELDS,
  PreviewUrl: fields.PREVIEW_URL_FIELDS, CreatePreviewUrl: fields.CREATE_PREVIEW_URL_FIELDS, TerminalToken: fields.TERMINAL_TOKEN_FIELDS,
  StoredPolicy: fields.STORED_POLICY_FIELDS, PolicySummary: fields.POLICY_SUMMARY_FIELDS,
  Tenant: fields.TENANT_FIELDS, TenantKey: fields.TENANT_KEY_FIELDS, CreatedKey: fields.CREATED_KEY_FIELDS,
  Limits: fields.LIMITS_FIELDS, NewTenant: fields.NEW_TENANT_FIELDS, TenantPatch: fields.TENANT_PATCH_FIELDS,
  SecretInfo: fields.SECRET_FIELDS, CreateSecret: fields.CREATE_SECRET_FIELDS,
  BuildProgress: fields.BUILD_PROGRESS_FIELDS,
  SnapshotPool: fields.SNAPSHOT_POOL_FIELDS, SnapshotPoolBody: fields.SNAPSHOT_POOL_BODY_FIELDS,
};
const LISTS = {
  SandboxList: "sandboxes", SnapshotList: "snapshots", TemplateList: "templates", FileList: "entries", EgressEventList: "events",
  CodeContextList: "contexts", ProcessList: "processes", PolicyList: "policies", TenantList: "tenants", KeyList: "keys",
  SecretList: "secrets",
};
// The terminal's control messages: JSON over the pty WebSocket (oneOf), read as is.
const RAW = new Set(["ErrorBody", "ErrorDetail", "OutputChunk", "EgressMode", "ExecReason", "OutputEncoding", "CpuLimitBasis",
  "TerminalClientMessage", "TerminalServerMessage", "Effect", "Op",
  // A template's state: a string enum, passed as is.
  "TemplateState",
  // A rule's credential binding travels in the policy document's own format.
  "CredentialBinding", "Injection", "Scheme", ...fields.PASS_THROUGH]);

// Policy documents pass through as written (docs/policy.md): their
// multi-word keys stay snake_case in the SDK too, listed here one by one.
const DOCUMENT_KEYS = new Set(["Rule.approval_timeout_s"]);

/** A schema's properties, `allOf` parts merged. */
function properties(schemas, s) {
  if (s.$ref) return properties(schemas, schemas[s.$ref.split("/").pop()]);
  return Object.assign({}, s.properties ?? {}, ...(s.allOf ?? []).map((p) => properties(schemas, p)));
}

function check(doc) {
  assert.equal(generate(doc), WIRE, "src/wire.ts is stale: run `npm run gen` and map the new fields");
  const ops = new Set();
  for (const [p, item] of Object.entries(doc.paths)) for (const m of Object.keys(item)) ops.add(`${m.toUpperCase()} ${p}`);
  const sdk = new Set(Object.keys(ROUTES));
  assert.deepEqual([...ops].filter((o) => !sdk.has(o)), [], "routes the SDK does not call");
  assert.deepEqual([...sdk].filter((o) => !ops.has(o) && !AHEAD.has(o) && !UNDOCUMENTED.has(o)), [], "SDK routes the API lacks");
  const schemas = doc.components.schemas;
  for (const name of Object.keys(schemas)) {
    assert.ok(name in MAPS || name in LISTS || RAW.has(name), `schema ${name} not mapped by the SDK`);
  }
  for (const name of fields.PASS_THROUGH) {
    for (const prop of Object.keys(schemas[name].properties)) {
      if (DOCUMENT_KEYS.has(`${name}.${prop}`)) continue;
      assert.match(prop, /^[a-z]+$/, `${name}.${prop} needs a camelCase mapping`);
    }
  }
  for (const [name, map] of Object.entries(MAPS)) {
    assert.deepEqual(Object.keys(map).sort(), Object.keys(properties(schemas, schemas[name])).sort(), name);
  }
}

test("committed docs/openapi.json", () => check(JSON.parse(readFileSync(DOC, "utf8"))));

test("the live daemon's /openapi.json", async () => check(await client.openapi()));

test("the check catches a new field or route", () => {
  const doc = () => JSON.parse(readFileSync(DOC, "utf8"));
  const a = doc();
  a.components.schemas.ExecResponse.properties.new_field = { type: "integer" };
  assert.throws(() => check(a));
  const b = doc();
  b.paths["/v1/sandboxes/{id}/pause"] = { post: {} };
  assert.throws(() => check(b));
  for (const schema of ["CodeSummary", "CodeBody", "CodeResultItem", "ProcessInfo", "ProcessChunk", "SignalBody"]) {
    const c = doc();
    c.components.schemas[schema].properties.new_field = { type: "integer" };
    assert.throws(() => check(c), schema);
  }
  // And gen-wire --check (run by `npm run build`) refuses a stale wire.ts.
  assert.doesNotThrow(() => execFileSync("node", [join(here, "../scripts/gen-wire.mjs"), "--check"]));
});
