"""Prints what changed in the checkout against the tar it was made from
(git may not be in the template): a --stat-like summary, a marker line,
then a unified diff. Run inside the sandbox by the session runner."""

import difflib
import io
import os
import sys
import tarfile

base_tar, root = sys.argv[1], sys.argv[2]
base = {}
with tarfile.open(base_tar) as t:
    for m in t.getmembers():
        name = os.path.normpath(m.name)
        if m.isfile() and not (name == ".git" or name.startswith(".git/") or "__pycache__" in name):
            base[name] = t.extractfile(m).read()
now = {}
for d, dirs, files in os.walk(root):
    dirs[:] = [x for x in dirs if not (d == root and x == ".git") and x != "__pycache__"]
    for f in files:
        p = os.path.join(d, f)
        rel = os.path.relpath(p, root)
        try:
            with open(p, "rb") as fh:
                now[rel] = fh.read(4 << 20)
        except OSError:
            pass
out, stat = io.StringIO(), []
for name in sorted(set(base) | set(now)):
    a, b = base.get(name), now.get(name)
    if a == b:
        continue
    if b"\0" in (a or b"") or b"\0" in (b or b""):
        stat.append(f" {name} | binary")
        out.write(f"Binary files a/{name} and b/{name} differ\n")
        continue
    al = a.decode("utf-8", "replace").splitlines(keepends=True) if a is not None else []
    bl = b.decode("utf-8", "replace").splitlines(keepends=True) if b is not None else []
    lines = list(difflib.unified_diff(al, bl, "a/" + name if a is not None else "/dev/null",
                                      "b/" + name if b is not None else "/dev/null"))
    plus = sum(1 for x in lines if x.startswith("+") and not x.startswith("+++"))
    minus = sum(1 for x in lines if x.startswith("-") and not x.startswith("---"))
    stat.append(f" {name} | +{plus} -{minus}")
    out.writelines(x if x.endswith("\n") else x + "\n" for x in lines)
print("\n".join(stat) + (f"\n {len(stat)} files changed" if stat else ""))
print("@@HATCHERY@@")
sys.stdout.write(out.getvalue())
