# Filesystem operations for the E2B adapter (hatchery-e2b), run inside the
# sandbox as the requesting user: `python3 -c <this> OP JSON`. Prints one
# JSON object; errors as {"error": kind, "message": ...}. `watch` prints
# one JSON line per event until killed.
import json, os, stat, sys, pwd, grp, shutil, errno

def kind_of(e):
    return {errno.ENOENT: "not_found", errno.EEXIST: "exists", errno.EACCES: "permission",
            errno.EPERM: "permission", errno.ENOTDIR: "not_dir", errno.EISDIR: "is_dir",
            errno.ENOTEMPTY: "not_empty", errno.ENOSPC: "no_space",
            errno.EDQUOT: "no_space"}.get(e.errno, "io")

def perms(m):
    t = "d" if stat.S_ISDIR(m) else "L" if stat.S_ISLNK(m) else "-"
    bits = "rwxrwxrwx"
    return t + "".join(bits[i] if m & (1 << (8 - i)) else "-" for i in range(9))

def name_of(f, ids):
    try:
        return f(ids).pw_name if f is pwd.getpwuid else f(ids).gr_name
    except KeyError:
        return str(ids)

# User-defined file metadata lives in extended attributes under this
# namespace, as envd keeps it; other user.* attributes are not metadata.
META = "user.e2b."

def metadata(path):
    """The file's user.e2b.* attributes, prefix stripped. Best effort, as
    envd's: a filesystem without xattrs (or a dangling link) has none, and
    a name or value that is not UTF-8 (set with setfattr, say) is skipped
    rather than spoiling the whole entry."""
    out = {}
    try:
        names = os.listxattr(path)
    except OSError:
        return out
    for n in names:
        if not n.startswith(META):
            continue
        try:
            out[n[len(META):]] = os.getxattr(path, n).decode("utf-8")
        except (OSError, UnicodeDecodeError):
            pass
    return out

def set_metadata(path, meta):
    """Makes the file's metadata exactly `meta`: keys it no longer has are
    removed (an upload replaces the set; no metadata clears it). Nothing is
    touched when the set is already right, so an upload without metadata
    adds no attribute event to a watch. Filesystems without xattrs (/proc)
    keep none, as with envd."""
    try:
        names = os.listxattr(path)
    except OSError as e:
        if e.errno in (errno.ENOTSUP, errno.EOPNOTSUPP):
            return
        raise
    for n in names:
        if n.startswith(META) and n[len(META):] not in meta:
            try:
                os.removexattr(path, n)
            except OSError as e:
                if e.errno != errno.ENODATA:
                    raise
    for k, v in meta.items():
        os.setxattr(path, META + k, v.encode())

def entry(path):
    st = os.lstat(path)
    m = st.st_mode
    t = "dir" if stat.S_ISDIR(m) else "symlink" if stat.S_ISLNK(m) else "file" if stat.S_ISREG(m) else "other"
    e = {"name": os.path.basename(path) or "/", "type": t, "path": path, "size": st.st_size,
         "mode": stat.S_IMODE(m), "permissions": perms(m),
         "owner": name_of(pwd.getpwuid, st.st_uid), "group": name_of(grp.getgrgid, st.st_gid),
         "mtime_ns": st.st_mtime_ns, "metadata": metadata(path)}
    if t == "symlink":
        e["symlink_target"] = os.path.realpath(path)
        try:
            s2 = os.stat(path)
            if stat.S_ISDIR(s2.st_mode):
                e["type"] = "dir"
            elif stat.S_ISREG(s2.st_mode):
                e["type"] = "file"
        except OSError:
            pass
    return e

def listdir(path, depth, limit):
    out = []
    st = os.stat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise OSError(errno.ENOTDIR, "not a directory")
    def walk(d, level):
        for n in sorted(os.listdir(d)):
            if len(out) >= limit:
                return
            p = os.path.join(d, n)
            e = entry(p)
            out.append(e)
            if level < depth and stat.S_ISDIR(os.lstat(p).st_mode):
                try:
                    walk(p, level + 1)
                except PermissionError:
                    pass
    walk(path, 1)
    return out

# How long a repeat of the event just reported counts as the same event.
REPEAT = 0.05

# statfs f_type of the filesystems envd calls network mounts (NFS, CIFS,
# SMB, SMB2, FUSE), whose events may never arrive: watching them is refused
# unless the client allows it.
NETWORK_FS = {0x6969, 0xFF534D42, 0x517B, 0xFE534D42, 0x65735546}

def fs_type(path):
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    # struct statfs starts with f_type, a C long on Linux's 64-bit ABIs.
    buf = ctypes.create_string_buffer(256)
    if libc.statfs(path.encode(), buf) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return ctypes.c_long.from_buffer(buf).value & 0xFFFFFFFF

def watchable(path, allow_network):
    """Why `path` cannot be watched, as envd checks it, before the watch."""
    st = os.stat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise OSError(errno.ENOTDIR, "not a directory")
    if not allow_network and fs_type(path) in NETWORK_FS:
        return {"error": "invalid", "message": "cannot watch path on network filesystem: " + path}
    return {}

# Events whose path still names the entry they are about; a remove or a
# rename-away names one that is gone (a stat could find a newcomer), so
# they carry no entry, as in envd.
CARRIES_ENTRY = ("create", "write", "chmod")

def watch(path, recursive, with_entry=False):
    import ctypes, struct, select, time
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(os.O_NONBLOCK)
    if fd < 0:
        raise OSError(ctypes.get_errno(), "inotify_init1")
    # modify attrib moved_from moved_to create delete: fsnotify's set, as
    # envd watches (no close_write, which would double every write).
    mask = 0x2 | 0x4 | 0x40 | 0x80 | 0x100 | 0x200
    wds = {}
    def add(p):
        wd = libc.inotify_add_watch(fd, p.encode(), mask)
        if wd < 0:
            raise OSError(ctypes.get_errno(), "inotify_add_watch " + p)
        wds[wd] = p
    st = os.stat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise OSError(errno.ENOTDIR, "not a directory")
    add(path)
    if recursive:
        for d, subs, _ in os.walk(path):
            for s in subs:
                try:
                    add(os.path.join(d, s))
                except OSError:
                    pass
    print(json.dumps({"started": True}), flush=True)
    last, last_at = None, 0.0
    while True:
        select.select([fd], [], [])
        try:
            buf = os.read(fd, 65536)
        except BlockingIOError:
            continue
        i = 0
        while i + 16 <= len(buf):
            wd, m, _, ln = struct.unpack_from("iIII", buf, i)
            name = buf[i + 16:i + 16 + ln].rstrip(b"\0").decode("utf-8", "replace")
            i += 16 + ln
            base = wds.get(wd)
            if base is None:
                continue
            full = os.path.join(base, name) if name else base
            rel = os.path.relpath(full, path)
            if m & 0x100:
                t = "create"
                if recursive and m & 0x40000000:
                    try:
                        add(full)
                    except OSError:
                        pass
            elif m & 0x200:
                t = "remove"
            elif m & (0x40 | 0x80):
                t = "rename" if m & 0x40 else "create"
            elif m & 0x2:
                t = "write"
            elif m & 0x4:
                t = "chmod"
            else:
                continue
            # An event identical to the one just reported, within REPEAT
            # seconds of it, is the same change (one write is a truncate
            # and a write): dropped, as inotify merges identical events
            # that are still unread. Reported at once, not held back.
            now = time.monotonic()
            if (rel, t) == last and now - last_at < REPEAT:
                continue
            last, last_at = (rel, t), now
            ev = {"name": rel, "type": t}
            if with_entry and t in CARRIES_ENTRY:
                # Best effort: gone again by now means no entry.
                try:
                    ev["entry"] = entry(full)
                except OSError:
                    pass
            print(json.dumps(ev), flush=True)

def prepare_upload(p, meta):
    """Before an upload's bytes are written (as root, in place, which keeps
    the owner and the attributes): the parents and the file are created as
    the requesting user, the file is given to them if they may take it
    (envd chowns every upload to its user, which a watch sees as chmod),
    and its metadata becomes exactly `meta`. Returns the metadata now on
    the file, which is what the upload reports (none where the filesystem
    keeps no attributes)."""
    d = os.path.dirname(p)
    if d:
        os.makedirs(d, exist_ok=True)
    if os.path.isdir(p):
        raise OSError(errno.EISDIR, "path is a directory")
    with open(p, "ab"):
        pass
    try:
        os.chown(p, os.getuid(), os.getgid())
    except OSError:
        pass
    set_metadata(p, meta)
    return {"metadata": metadata(p)}

def main():
    op, args = sys.argv[1], json.loads(sys.argv[2])
    try:
        if op == "stat":
            r = {"entry": entry(args["path"])}
            os.stat(args["path"])
        elif op == "mkdir":
            p = args["path"]
            if os.path.lexists(p):
                raise OSError(errno.EEXIST, "already exists")
            os.makedirs(p)
            r = {"entry": entry(p)}
        elif op == "move":
            src, dst = args["source"], args["destination"]
            os.lstat(src)
            parent = os.path.dirname(dst)
            if parent:
                os.makedirs(parent, exist_ok=True)
            os.rename(src, dst)
            r = {"entry": entry(dst)}
        elif op == "list":
            r = {"entries": listdir(args["path"], args["depth"], args["limit"])}
        elif op == "remove":
            p = args["path"]
            # As envd's (Go's os.RemoveAll): a missing path is removed.
            try:
                st = os.lstat(p)
            except FileNotFoundError:
                print(json.dumps({}), flush=True)
                return
            if stat.S_ISDIR(st.st_mode):
                shutil.rmtree(p)
            else:
                os.unlink(p)
            r = {}
        elif op == "watchable":
            r = watchable(args["path"], args.get("allow_network_mounts", False))
        elif op == "watch":
            watch(args["path"], args["recursive"], args.get("include_entry", False))
            return
        elif op == "prepare_upload":
            r = prepare_upload(args["path"], args.get("metadata") or {})
        else:
            r = {"error": "invalid", "message": "unknown op " + op}
    except OSError as e:
        r = {"error": kind_of(e), "message": "%s: %s" % (e.strerror or e, args.get("path") or args.get("source"))}
    print(json.dumps(r), flush=True)

main()
