"""`hatchery secret ...` against a live daemon: a value from a file and one
from stdin (never an argument), listed by name and size only, no value in
any output; bad input refused with the daemon's message and nothing stored;
a tenant key refused; delete, and delete again."""

import json
import os
import re
import tempfile


def names(hx, **kw):
    return {s["name"]: s for s in json.loads(hx("secret", "list", "--json", check=0, **kw).stdout)}


def test_secret_lifecycle(hx):
    value = "cli-secret-" + os.urandom(8).hex()
    with tempfile.NamedTemporaryFile("w", suffix=".tok", delete=False) as f:
        f.write(value + "\n")      # as `echo` writes it: the newline is dropped
    try:
        made = hx("secret", "create", "CLI_FILE", "--value-file", f.name, check=0)
    finally:
        os.unlink(f.name)
    assert made.stdout.strip() == "CLI_FILE" and value not in made.stdout + made.stderr
    made = hx("secret", "create", "CLI_STDIN", "--value-stdin", "--json", input="abc", check=0)
    assert json.loads(made.stdout)["bytes"] == 3 and "value" not in json.loads(made.stdout)

    got = names(hx)
    assert got["CLI_FILE"]["bytes"] == len(value) and got["CLI_STDIN"]["bytes"] == 3
    table = hx("secret", "ls", check=0).stdout
    assert re.search(rf"^CLI_FILE\s+-\s+{len(value)}\s", table, re.M), table
    assert value not in table

    # Bad input: each refused, nothing stored.
    for args, kw, needle in [
        (("CLI_DUP", "--value-stdin"), {"input": "x" * 4097}, "invalid_secret"),
        (("CLI_DUP", "--value-stdin"), {"input": "two\nlines"}, "invalid_secret"),
        (("CLI_DUP", "--value-stdin"), {"input": ""}, "invalid_secret"),
        (("bad name", "--value-stdin"), {"input": "v"}, "invalid_secret"),
        (("CLI_FILE", "--value-stdin"), {"input": "v"}, "409"),
        (("CLI_DUP", "--value-file", "/nonexistent/tok"), {}, "/nonexistent/tok"),
        (("CLI_DUP", "--value-stdin"), {"input": "a" * (64 * 1024 + 1)}, "over 65536 bytes"),
    ]:
        p = hx("secret", "create", *args, **kw)
        assert p.returncode != 0 and needle in p.stderr, (args, p.stderr)
    # A value is never an argument; one of the two sources is required.
    p = hx("secret", "create", "CLI_DUP")
    assert p.returncode == 2 and "--value-file" in p.stderr, p.stderr
    p = hx("secret", "create", "CLI_DUP", "--value", "x")
    assert p.returncode == 2, p.stderr
    assert "CLI_DUP" not in names(hx)

    # A tenant key keeps secrets of its own (issue 39): it sees none of
    # the operator's, may reuse a name, and cannot delete the operator's.
    tid = hx("tenant", "create", "cli-secrets", check=0).stdout.strip()
    key = hx("tenant", "key", "create", tid, check=0).stdout.strip()
    as_tenant = {"HATCHERY_API_KEY": key}
    assert list(names(hx, env=as_tenant)) == []
    made = hx("secret", "create", "CLI_FILE", "--value-stdin", input="tv", env=as_tenant, check=0)
    assert made.stdout.strip() == "CLI_FILE", made
    assert list(names(hx, env=as_tenant)) == ["CLI_FILE"]
    mine = [x for x in json.loads(hx("secret", "list", "--json", check=0).stdout) if x["name"] == "CLI_FILE"]
    assert sorted(x.get("tenant") or "" for x in mine) == ["", tid], mine
    assert hx("secret", "delete", "CLI_STDIN", env=as_tenant).returncode != 0
    assert hx("secret", "delete", "CLI_FILE", env=as_tenant, check=0).stdout.split() == ["CLI_FILE"]
    assert list(names(hx, env=as_tenant)) == []
    hx("tenant", "rm", tid, check=0)

    assert hx("secret", "delete", "CLI_FILE", "CLI_STDIN", check=0).stdout.split() == ["CLI_FILE", "CLI_STDIN"]
    p = hx("secret", "rm", "CLI_FILE")
    assert p.returncode != 0 and "404" in p.stderr, p.stderr
    assert not {"CLI_FILE", "CLI_STDIN"} & set(names(hx))
