"""Brings an environment's checkout to a session's commit, inside the
sandbox forked from the environment's snapshot. The session runner runs
`main` in the sandbox's warm Python interpreter (no process starts); as a
script it takes the same arguments:

    env_delta.py DELTA_TAR NEW_PATHS WORKDIR BASE_TAR TRACKED

DELTA_TAR holds the files added or changed since the environment's base
commit; NEW_PATHS (NUL-separated) every tracked path of the session's
commit; TRACKED the tracked paths of the checkout as it is. Tracked paths
that the new commit no longer has are removed, the delta is unpacked over
the checkout, and BASE_TAR (what the session's final diff is made
against: the checkout as the set-up left it) gets the same changes, so
the diff shows the agent's work only. What the set-up wrote and git does
not track is left alone. Standard library only (git may not be in the
template). Everything is local to `main`: the interpreter's globals stay
as they were."""

import io
import os
import sys
import tarfile

class Refused(Exception):
    """The delta names a path outside the checkout, or inside .git."""


def paths(f):
    with open(f, "rb") as fh:
        return {p.decode("utf-8", "surrogateescape") for p in fh.read().split(b"\0") if p}


def norm(name):
    return os.path.normpath(name).lstrip("/")


def main(delta_tar, new_paths, root, base_tar, tracked):
    old, new = paths(tracked), paths(new_paths)
    gone = old - new
    for p in sorted(gone, reverse=True):
        full = os.path.join(root, p)
        try:
            if os.path.islink(full) or os.path.isfile(full):
                os.remove(full)
            d = os.path.dirname(full)
            while d != root and d.startswith(root) and not os.listdir(d):
                os.rmdir(d)
                d = os.path.dirname(d)
        except OSError:
            pass

    with tarfile.open(delta_tar) as t:
        members = t.getmembers()
        for m in members:
            n = norm(m.name)
            if n.startswith("..") or n == ".git" or n.startswith(".git/"):
                raise Refused(f"refusing delta member {m.name!r}")
            full = os.path.join(root, n)
            # A changed file replaces what is there (a dir that became a file,
            # a link that became a file).
            if os.path.islink(full) or os.path.isfile(full):
                os.remove(full)
        t.extractall(root, members=members)
    changed = {norm(m.name) for m in members}

    # The base tar: the old one without what is gone or changed, then the delta.
    out = io.BytesIO()
    with tarfile.open(base_tar) as src, tarfile.open(fileobj=out, mode="w") as dst:
        for m in src.getmembers():
            n = norm(m.name)
            if n in gone or n in changed:
                continue
            dst.addfile(m, src.extractfile(m) if m.isfile() else None)
        with tarfile.open(delta_tar) as t:
            for m in t.getmembers():
                dst.addfile(m, t.extractfile(m) if m.isfile() else None)
    with open(base_tar + ".new", "wb") as fh:
        fh.write(out.getvalue())
    os.replace(base_tar + ".new", base_tar)
    with open(new_paths, "rb") as src, open(tracked, "wb") as dst:
        dst.write(src.read())
    return f"{len(changed)} changed, {len(gone)} removed"


if __name__ == "__main__":
    try:
        print(main(*sys.argv[1:6]))
    except Refused as e:
        sys.exit(str(e))
