"""The README / issue snippets, run unchanged in a fresh interpreter that
finds the daemon through HATCHERY_URL / HATCHERY_API_KEY. Only the
variable the snippet expects (`source`) is defined before it.

/work does not exist in the code-interpreter template (/workspace does);
the daemon's file write creates missing parent directories, so the
snippet's `cd /work` works. The snippet leaves the reviewer's fork and the
snapshot alive by design; the test checks exactly those remain and
removes them."""

import json
import os
import subprocess
import sys

import pytest

from hatchery import NotFound, Sandbox, Snapshot

SNIPPET = '''
from hatchery import Sandbox

sbx = Sandbox.create(template="code-interpreter", ttl_seconds=4500,
                     metadata={"candidate": "c-42", "kind": "interview-session"})
sbx.filesystem.write("/work/solution.py", source)          # str or bytes
r = sbx.exec("cd /work && timeout -s KILL 10 python3 solution.py", timeout_seconds=15)
print(r.stdout, r.stderr, r.exit_code)
snap = sbx.snapshot(); reviewer_copy = snap.fork()
sbx.kill()

with Sandbox.create(template="code-interpreter", ttl_seconds=120) as sbx:   # killed on exit
    ...
'''

PRELUDE = 'source = "import sys\\nprint(sum(range(10)))\\nprint(\'to stderr\', file=sys.stderr)\\nsys.exit(2)\\n"\n'
EPILOGUE = 'import json; print(json.dumps({"sbx": sbx.id, "snap": snap.id, "fork": reviewer_copy.id}))\n'


def test_python_snippet_runs_unchanged(daemon, client):
    env = dict(os.environ)
    out = subprocess.run([sys.executable, "-c", PRELUDE + SNIPPET + EPILOGUE], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "45" and lines[1] == " to stderr" and lines[2] == " 2", out.stdout
    ids = json.loads(lines[-1])
    daemon.created.update([ids["sbx"], ids["fork"]])
    # Both of the snippet's own sandboxes are gone; the reviewer's fork lives.
    assert [s.id for s in Sandbox.list(client=client)] == [ids["fork"]]
    fork = Sandbox.get(ids["fork"], client=client)
    assert fork.filesystem.read_text("/work/solution.py").startswith("import sys")
    assert fork.exec("cd /work && python3 solution.py").stdout == "45\n"
    fork.kill()
    # `sbx` was rebound by the `with`; the snapshot names the first one.
    snap = Snapshot.get(ids["snap"], client=client)
    for gone in (snap.sandbox_id, ids["sbx"]):
        with pytest.raises(NotFound):
            Sandbox.get(gone, client=client)
    assert snap.sandbox_id not in (ids["sbx"], ids["fork"])
    snap.delete()
