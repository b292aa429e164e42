"""Hatchery's in-sandbox Bash kernel: run_code in `bash` contexts.

Started by the agent like the Python kernel (`python3 -u -E -s -c <this
source>`, same pipes: requests on fd 3, events on fd 4, one JSON object a
line). It keeps one `bash` process for the context, so variables, functions
and the working directory persist between runs, as in a Jupyter Bash
kernel. A run's code is read into a variable through a here-document and
`eval`ed at the top level with stdin from /dev/null (so it cannot swallow
what follows it), then a marker with the status is printed on stdout and
on stderr; everything before the markers is the run's output.
"""
import json
import os
import select
import signal
import subprocess

os.set_inheritable(3, False)
os.set_inheritable(4, False)
_CHUNK = 65536


def _emit(event):
    data = memoryview((json.dumps(event, ensure_ascii=False) + "\n").encode("utf-8", "replace"))
    while data:
        data = data[os.write(4, data):]


def _quote(s):
    return "'" + s.replace("'", "'\\''") + "'"


def _valid_name(k):
    return k and (k[0].isalpha() or k[0] == "_") and all(c.isalnum() or c == "_" for c in k)


def _script(code, env, chdir, token):
    names = [k for k in env if _valid_name(k)]
    lines = []
    if chdir:
        lines.append("cd -- %s || true" % _quote(chdir))
    if names:
        # The run's env for this run only: saved, exported, restored after.
        lines.append("__hx_saved=$(declare -p %s 2>/dev/null)" % " ".join(names))
        lines += ["export %s=%s" % (k, _quote(env[k])) for k in names]
    lines += [
        "IFS= read -r -d '' __hx_code <<'%s'" % token,
        code,
        token,
        'eval "$__hx_code" </dev/null',
        "__hx_status=$?",
    ]
    if names:
        lines.append('unset %s; eval "$__hx_saved"; unset __hx_saved' % " ".join(names))
    lines.append("printf '%%s %%s\\n' %s \"$__hx_status\"; printf '%%s\\n' %s >&2" % (token, token))
    return "\n".join(lines) + "\n"


class _Out:
    """One of bash's output pipes, read until the run's marker."""

    def __init__(self, fd, kind):
        self.fd, self.kind, self.buf, self.done = fd, kind, b"", False

    def feed(self, rid, token):
        chunk = os.read(self.fd, _CHUNK)
        if not chunk:
            return False
        self.buf += chunk
        at = self.buf.find(token)
        if at >= 0:
            out, self.buf, self.done = self.buf[:at], self.buf[at:], True
        else:
            # Keep what could be the start of a marker for the next read.
            keep = max(0, len(self.buf) - len(token))
            out, self.buf = self.buf[:keep], self.buf[keep:]
        if out:
            _emit({"id": rid, "type": self.kind, "text": out.decode("utf-8", "replace")})
        return True


def main():
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a run is stopped by killing the unit
    bash = subprocess.Popen(["/bin/bash", "--norc", "--noprofile"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, close_fds=True)
    requests = open(3, "rb")
    _emit({"type": "ready", "pid": os.getpid(), "language": "bash"})
    count = 0
    for line in requests:
        try:
            req = json.loads(line)
            rid, code, env = req["id"], req["code"], req.get("env") or {}
            if not isinstance(code, str) or not isinstance(env, dict):
                raise ValueError("bad request")
        except Exception as exc:
            _emit({"id": None, "type": "error", "name": "KernelError", "value": "malformed request: %s" % exc,
                   "traceback": ""})
            _emit({"id": None, "type": "done", "execution_count": count})
            continue
        count += 1
        token = "__hatchery_end_%s" % os.urandom(8).hex()
        bash.stdin.write(_script(code, env, req.get("chdir"), token).encode())
        bash.stdin.flush()
        outs = [_Out(bash.stdout.fileno(), "stdout"), _Out(bash.stderr.fileno(), "stderr")]
        marker = token.encode()
        while not all(o.done for o in outs):
            ready, _, _ = select.select([o.fd for o in outs if not o.done], [], [])
            for o in outs:
                if o.fd in ready and not o.feed(rid, marker):
                    return  # bash exited (`exit` in a cell): the agent restarts the context
        _emit({"id": rid, "type": "done", "execution_count": count})


if __name__ == "__main__":
    main()
