// Round and InterviewSession against the live daemon: create, invite, the
// candidate's Run/stream/Submit with only their token, the reviewer's
// report and a replay fork; a candidate token cannot read the report.
import assert from "node:assert/strict";
import { test } from "node:test";
import { InterviewSession, PermissionDenied, Round } from "../dist/index.js";
import { client, noLeftovers, URL } from "./helpers.mjs";

noLeftovers();

const TESTS = {
  "test_hidden.py":
    "from solution import add\n\ndef test_add():\n    assert add(2, 3) == 5\n\ndef test_neg():\n    assert add(-2, 1) == -1, 'TS-SECRET'\n",
};

test("a round end to end", async () => {
  const rnd = await Round.create({
    name: "ts round",
    starterFiles: { "solution.py": "def add(a, b):\n    pass\n" },
    tests: { files: TESTS },
    cpuTimeLimitMs: 1000,
    sessionSeconds: 120,
    client,
  });
  assert.equal(rnd.state, "ready");
  assert.ok((await Round.list({ client })).some((r) => r.id === rnd.id));
  const inv = await rnd.invite("ada");
  assert.ok(inv.token && inv.url.endsWith(`#${inv.token}`));

  const s = await InterviewSession.connect(URL, rnd.id, inv.id, inv.token);
  assert.equal(s.state, "live");
  assert.deepEqual(await s.files(), { "solution.py": "def add(a, b):\n    pass\n" });
  const r = await s.run({ "solution.py": "def add(a, b):\n    return a + b\nprint(add(1, 2))\n" });
  assert.equal(r.verdict, "ok");
  assert.equal(r.stdout, "3\n");
  assert.equal((await s.run({ "solution.py": "while True: pass\n" })).verdict, "time_limit");
  const events = [];
  for await (const ev of s.runStream({ "solution.py": "print('streamed')\n" })) events.push(ev);
  assert.equal(events.at(-1).event, "result");
  assert.equal(events.filter((e) => e.event === "stdout").map((e) => e.data.data).join(""), "streamed\n");

  const acc = await s.submit({ "solution.py": "def add(a, b):\n    return abs(a + b)\n" });
  const res = await s.waitGraded(acc.submission_id, 180_000);
  assert.deepEqual([res.passed, res.total, res.failed_cases], [1, 2, ["test_neg"]]);
  await assert.rejects(s.report(), PermissionDenied);

  const { token } = await rnd.reviewerToken(600);
  const rv = await Round.get(rnd.id, { token, url: URL });
  const [sess] = await rv.sessions();
  const rep = await sess.report();
  assert.ok(JSON.stringify(rep).includes("TS-SECRET"));
  assert.deepEqual((await sess.runs()).map((x) => x.verdict), ["ok", "time_limit", "ok"]);
  const replay = await sess.replayNow();
  const fork = await rv.forkReplay(replay.id);
  assert.ok((await fork.files()).includes("solution.py"));
  assert.match(await fork.read("solution.py"), /abs\(a \+ b\)/);
  await fork.delete();

  assert.equal((await s.end()).state, "ended");
  assert.equal((await rnd.archive()).state, "archived");
});
