"""Writes the checkout's work tree as the file part of a `git fast-import`
commit (`deleteall`, then one `M` line with inline data per file), for the
broker to commit and push on the host. Git may not be in the template, and
the host never unpacks anything the sandbox made: fast-import only turns
this stream into objects. Run inside the sandbox by the broker.

usage: export_tree.py ROOT OUT MAX_BYTES
"""

import os
import stat
import sys

root, out_path, cap = sys.argv[1], sys.argv[2], int(sys.argv[3])
SKIP_DIRS = {".git", "__pycache__"}


def quote(path):
    b = path.encode("utf-8", "surrogateescape")
    o = ['"']
    for c in b:
        if c in (0x22, 0x5C):
            o.append("\\" + chr(c))
        elif 0x20 <= c < 0x7F:
            o.append(chr(c))
        else:
            o.append("\\%03o" % c)
    o.append('"')
    return "".join(o)


total = 0
with open(out_path, "wb") as out:
    out.write(b"deleteall\n")
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x not in SKIP_DIRS and not os.path.islink(os.path.join(d, x)))
        links = [x for x in os.listdir(d) if os.path.islink(os.path.join(d, x))]
        for f in sorted(set(files) | set(links)):
            p = os.path.join(d, f)
            rel = os.path.relpath(p, root)
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                mode, data = "120000", os.readlink(p).encode("utf-8", "surrogateescape")
            elif stat.S_ISREG(st.st_mode):
                mode = "100755" if st.st_mode & 0o111 else "100644"
                with open(p, "rb") as fh:
                    data = fh.read()
            else:
                continue
            total += len(data)
            if total > cap:
                sys.stderr.write("work tree over %d bytes\n" % cap)
                sys.exit(3)
            out.write(("M %s inline %s\ndata %d\n" % (mode, quote(rel), len(data))).encode())
            out.write(data)
            out.write(b"\n")
print(total)
