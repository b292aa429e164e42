"""Writes the checkout's work tree as a Hatchery tree stream (`replace`,
then one `file` record per regular file or symlink; the grammar is in
crates/hatchery-broker/src/tree.rs) for the broker to commit and push on
the host. Run inside the sandbox by the broker; git may not be in the
template. The stream carries paths, modes and contents only: the host
parses it strictly and writes the commit (author, message, parent)
itself, so nothing here (or in a file put in this one's place) can.

usage: export_tree.py ROOT OUT MAX_BYTES
"""

import os
import stat
import sys

root, out_path, cap = sys.argv[1], sys.argv[2], int(sys.argv[3])


def skipped(name):
    # The host refuses `.git` components in any case (and NTFS's trailing
    # dots and spaces); a nested repository's is not part of the tree.
    return name == "__pycache__" or name.lower().rstrip(". ") == ".git"


total = 0
with open(out_path, "wb") as out:
    out.write(b"hatchery-tree 1\nreplace\n")
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if not skipped(x) and not os.path.islink(os.path.join(d, x)))
        links = [x for x in os.listdir(d) if os.path.islink(os.path.join(d, x))]
        for f in sorted(set(files) | set(links)):
            if skipped(f):
                continue
            p = os.path.join(d, f)
            rel = os.path.relpath(p, root).encode("utf-8", "surrogateescape")
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                mode, data = b"120000", os.readlink(p).encode("utf-8", "surrogateescape")
            elif stat.S_ISREG(st.st_mode):
                mode = b"100755" if st.st_mode & 0o111 else b"100644"
                with open(p, "rb") as fh:
                    data = fh.read()
            else:
                continue
            total += len(data)
            if total > cap:
                sys.stderr.write("work tree over %d bytes\n" % cap)
                sys.exit(3)
            out.write(b"file %s %d %d\n" % (mode, len(rel), len(data)))
            out.write(rel)
            out.write(data)
            out.write(b"\n")
    out.write(b"end\n")
print(total)
