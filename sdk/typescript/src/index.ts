// hatchery-sdk: disposable, isolated Linux sandboxes.
//
//   import { Sandbox } from "hatchery-sdk";
//   const sbx = await Sandbox.create({ ttlSeconds: 120 });
//   try {
//     console.log((await sbx.exec("python3 -c 'print(6*7)'")).stdout);
//     console.log((await sbx.runCode("6 * 7")).text);
//     const server = await sbx.exec("python3 -m http.server 8000", { background: true });
//     const { url } = await sbx.previewUrl(8000);  // for a browser, no key
//   } finally { await sbx.kill(); }
export { Client, ROUTES, configure, getDefaultClient, type Route } from "./client.js";
export { type ClientOptions, DEFAULT_URL, DEFAULT_KEY_FILE } from "./http.js";
export {
  ExecStream, Filesystem, Network, Process, ProcessOutput, Sandbox, Snapshot, Template, type BuildCallbacks,
  type StreamCallbacks, type WithClient,
} from "./sandbox.js";
export * from "./errors.js";
export { Terminal } from "./terminal.js";
export { Policies } from "./policies.js";
export { Tenants, type TenantOptions } from "./tenants.js";
export { Secrets } from "./secrets.js";
export type { Secret } from "./models.js";
export type { CreatedKey, Limits, Tenant, TenantKey } from "./models.js";
export type { PolicyDocument, PolicyRule, PolicySummary, StoredPolicy } from "./models.js";
export { Execution, Result } from "./models.js";
export type {
  BuildAccepted, BuildEvent, BuildProgress, CodeContext, CreateCodeContextOptions, CreateSandboxOptions, EgressMode, ExecOptions,
  ExecReason, ExecResult, ExecutionError, FileEntry, ForkOptions, Logs, NetworkEvent, NetworkPolicy, NetworkRule,
  OutputChunk, OutputEncoding, PreviewUrl, PreviewUrlOptions, ProcessChunk, PtyOptions, TerminalExit, TerminalToken, ProcessInfo, ProcessOutputOptions, RunCodeOptions, SandboxInfo, Signal,
  SnapshotInfo, SnapshotOptions, SnapshotPool, TemplateInfo, TemplateSpec, WaitOptions,
} from "./models.js";
export * as fields from "./models.js";
export type * as wire from "./wire.js";
export { InterviewSession, ReplayFork, Round, type CandidateResult, type CreateRoundOptions, type Replay, type RoundInfo, type RunEvent, type RunMode, type RunResult, type SessionInfo as RoundSessionInfo, type SubmitAccepted, type Verdict } from "./rounds.js";
export { Session, FINAL_STATES, type CreateSessionOptions, type SessionEvent, type SessionInfo } from "./session.js";
export {
  Environment,
  type CreateEnvironmentOptions,
  type EnvironmentInfo,
  type EnvironmentVersion,
  type BuildReason,
} from "./environment.js";
