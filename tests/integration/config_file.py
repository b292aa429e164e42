"""A daemon's flags as a configuration file (hatcheryd --config FILE): the
keys, their sections and their TOML types are read from the daemon's own
`config example` output (one line per key: `# --FLAG, VAR: TYPE`), so the
translation follows the flags and a flag without a key fails here."""

import functools
import json
import os
import re
import subprocess

FLAG_LINE = re.compile(r"^# --([a-z0-9-]+), (\S*): (.+)$")
KEY_LINE = re.compile(r"^#? ?([a-z_]+) = ")


@functools.lru_cache(maxsize=None)
def keys(hatcheryd):
    """{flag: (section, name, type, variable)} from the examples of every role."""
    out = {}
    for role in ("all", "host", "control"):
        text = subprocess.run([hatcheryd, "config", "example", "--role", role], check=True,
                              capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"}).stdout
        section = flag = None
        for line in text.splitlines():
            if line.startswith("["):
                section = line.strip("[]")
            elif m := FLAG_LINE.match(line):
                flag = m.groups()
            elif flag and (m := KEY_LINE.match(line)):
                out[flag[0]] = (section, m.group(1), flag[2], flag[1])
                flag = None
    return out


def toml_value(kind, values):
    if kind == "an array of strings":
        return json.dumps(values)
    (v,) = values
    if kind in ("an integer", "a number"):
        float(v)  # a number, written as given
        return v
    if kind == "true or false":
        return v
    return json.dumps(v)  # a JSON string is a TOML basic string


def write(hatcheryd, argv, path):
    """Writes `argv` (flags, as the daemon takes them) to `path` as TOML."""
    table = keys(hatcheryd)
    sections, i = {}, 0
    while i < len(argv):
        flag, value = argv[i], None
        assert flag.startswith("--"), f"not a flag: {flag}"
        flag = flag[2:]
        if "=" in flag:
            flag, value = flag.split("=", 1)
        section, name, kind, _ = table[flag]
        if value is None:
            if kind == "true or false":
                value = "true"
            else:
                i += 1
                value = argv[i]
        sections.setdefault(section, {}).setdefault(name, (kind, []))[1].append(value)
        i += 1
    with open(path, "w") as f:
        for section, items in sections.items():
            f.write(f"[{section}]\n")
            for name, (kind, values) in items.items():
                f.write(f"{name} = {toml_value(kind, values)}\n")
    os.chmod(path, 0o600)
    return path


def variables(hatcheryd):
    """The flags' environment variables, which would beat the file."""
    return {v for (_, _, _, v) in keys(hatcheryd).values()}
