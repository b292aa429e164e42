// The `e2b` npm package's network options against a live daemon: run by
// test_network.py with E2B_PEER_A / E2B_PEER_B, two HTTP servers in network
// namespaces that test made, and the variables of sdk.test.mjs.
import assert from "node:assert/strict";
import { test } from "node:test";
import { pathToFileURL } from "node:url";

const { Sandbox, ALL_TRAFFIC } = await import(pathToFileURL(process.env.E2B_JS_MODULE).href);
const A = process.env.E2B_PEER_A;
const B = process.env.E2B_PEER_B;

// "open" when an HTTP GET from inside the sandbox is answered; an expected
// open is retried twice (a restored sandbox's first connection, as in
// test_network.py's reach()).
async function reach(sbx, host, expectOpen) {
  let last = "blocked";
  for (let i = 0; i < (expectOpen ? 3 : 1); i++) {
    const cmd = `timeout 5 bash -c 'exec 3<>/dev/tcp/${host}/80 && printf "GET / HTTP/1.0\\r\\n\\r\\n" >&3 && cat <&3' 2>/dev/null; true`;
    const r = await sbx.commands.run(cmd, { timeoutMs: 30_000 });
    last = r.stdout.includes(`hello from ${host}:80`) ? "open" : "blocked";
    if (last === "open") break;
  }
  return last;
}

test("allowOut with denyOut ALL_TRAFFIC reaches the allowed peer only", async () => {
  const sbx = await Sandbox.create("base", {
    timeoutMs: 120_000,
    allowInternetAccess: true,
    network: { allowOut: [A], denyOut: [ALL_TRAFFIC] },
  });
  try {
    assert.equal(await reach(sbx, A, true), "open");
    assert.equal(await reach(sbx, B, false), "blocked");
  } finally {
    await sbx.kill();
  }
});

test("a header transform no credential binding could be is refused with the field named", async () => {
  // Header transforms are applied (test_headers.py); one for every host
  // is not.
  await assert.rejects(
    Sandbox.create("base", {
      network: { allowOut: ["api.example.com"], rules: { "*": [{ transform: { headers: { "X-K": "v" } } }] } },
    }),
    (e) => /network\.rules host "\*" is refused/.test(String(e.message)),
  );
});
