"""Per-session caps against a real daemon (docs/sessions.md, "Caps";
docs/threat-model.md, "3. What a session can store" and "5. The repository
fetch"): a `command` agent that floods stdout past a small
`--sessions-max-output-bytes` gets exactly one `output_capped` marker, what
the session stores stays at or under the cap (as `GET /v1/sessions/{id}`
reports it), and the daemon keeps serving; a repository over the size or
path cap fails its session naming the cap and leaves nothing on the host."""

import base64
import os

import pytest

from harness import metric
from sessions_support import SessionDaemon

CAP = 65_536  # the flag's smallest value
LINE = 500
LINES = 2_000  # about 1 MB of output: 15 times the cap

FLOOD = f"""import sys
for i in range({LINES}):
    sys.stdout.write("%05d " % i + "x" * {LINE} + "\\n")
sys.stdout.flush()
"""


@pytest.mark.timeout(600)
def test_output_flood_is_cut_at_the_byte_cap_with_one_marker(model, git_server):
    d = SessionDaemon(model.port, extra=["--sessions-max-output-bytes", str(CAP)]).start()
    try:
        repo = git_server.add_repo("flood", {"flood.py": FLOOD, "README.md": "x\n"})
        sid = d.new_session(repo, "flood stdout", agent={"kind": "command", "command": "python3 flood.py"})
        s = d.wait_state(sid, ("completed", "failed"), timeout=300)
        d.track_sandboxes(sid)
        evs = d.all_events(sid)
        assert [e["seq"] for e in evs] == list(range(1, len(evs) + 1))
        capped = [e for e in evs if e["type"] == "output_capped"]
        assert len(capped) == 1, capped
        assert capped[0]["cap"] == "output_bytes" and capped[0]["limit"] == CAP, capped[0]
        out = [e for e in evs if e["type"] == "agent_output"]
        # Some of the flood was kept, in order, and most of it was not.
        assert 0 < len(out) < LINES // 4, len(out)
        kept = [int(e["text"].split()[0]) for e in out]
        assert kept == list(range(len(kept))), kept[:10]
        # The marker comes right after the last line kept.
        assert capped[0]["seq"] > out[-1]["seq"]
        # Its storage, against the cap.
        st = d.session(sid)["storage"]
        assert st["max_output_bytes"] == CAP, st
        assert 0 < st["output_bytes"] <= CAP, st
        assert st["caps_reached"] == ["output_bytes"], st
        # The agent was not stuck: it ran to its end, and the session ended
        # the way a command agent that exits 0 ends.
        assert s["state"] == "completed", (s, evs[-5:])
        # Counted in metrics.
        assert metric(d, "hatchery_sessions_caps_hit_total", 'cap="output_bytes"') == 1
        dropped = metric(d, "hatchery_sessions_output_dropped_lines_total", 'cap="output_bytes"')
        assert dropped == LINES - len(out), (dropped, len(out))
        # The daemon is alive and serving.
        assert d.proc.poll() is None
        assert d.request("GET", "/v1/sessions").status == 200
        assert d.session(sid)["state"] == "completed"
    finally:
        d.cleanup_sessions()


@pytest.mark.timeout(300)
def test_a_repository_over_a_fetch_cap_fails_its_session_and_leaves_nothing(model, git_server):
    cap_bytes, cap_files = 1 << 20, 500
    d = SessionDaemon(model.port, extra=["--sessions-max-repo-bytes", str(cap_bytes),
                                         "--sessions-max-repo-files", str(cap_files)]).start()
    try:
        # About 4 MiB of base64 of random bytes: about 3 MiB once packed,
        # three times the cap whatever git compresses.
        big = git_server.add_repo("huge", {"big.txt": base64.b64encode(os.urandom(3 << 20)).decode(),
                                           "README.md": "x\n"})
        # Small, but one path over the path cap.
        many = git_server.add_repo("many", {f"d/f{i}.txt": "" for i in range(cap_files + 1)})
        # Exactly at the path cap: fetched.
        ok = git_server.add_repo("at-cap", {f"d/f{i}.txt": "" for i in range(cap_files)})
        agent = {"kind": "command", "command": "ls d | wc -l"}
        sids = {name: d.new_session(repo, "t", agent=agent)
                for name, repo in (("big", big), ("many", many), ("ok", ok))}
        for sid in sids.values():
            d.wait_state(sid, ("completed", "failed"), timeout=120)
            d.track_sandboxes(sid)
        s = d.session(sids["big"])
        assert s["state"] == "failed" and s["reason"].startswith("repo_fetch_failed"), s
        assert f"over the cap of {cap_bytes} bytes" in s["reason"], s
        s = d.session(sids["many"])
        assert s["state"] == "failed" and f"more than {cap_files} paths" in s["reason"], s
        s = d.session(sids["ok"])
        assert s["state"] == "completed", s
        out = [e["text"] for e in d.all_events(sids["ok"]) if e["type"] == "agent_output"]
        assert out == [str(cap_files)], out
        assert metric(d, "hatchery_sessions_caps_hit_total", 'cap="repo_bytes"') + \
            metric(d, "hatchery_sessions_caps_hit_total", 'cap="repo_disk"') == 1
        assert metric(d, "hatchery_sessions_caps_hit_total", 'cap="repo_files"') == 1
        # Each fetch worked in a directory of its own, gone however it ended.
        assert os.listdir(os.path.join(d.data_dir, "repo-fetch")) == []
        assert d.proc.poll() is None
    finally:
        d.cleanup_sessions()
