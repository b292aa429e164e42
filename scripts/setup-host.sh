#!/usr/bin/env bash
# Installs the system packages Hatchery needs on a Debian bookworm host.
# Idempotent: every step checks before it acts, so `make run` / `make test`
# can call it each time and it costs nothing once the host is ready.
set -euo pipefail

need_root() { [ "$(id -u)" = 0 ] || { echo "setup-host: run as root (it installs packages)" >&2; exit 1; }; }

runsc_ok() {
  # Bookworm's 2022 runsc breaks statx (ls fails in the sandbox); we need the
  # 2024 build from trixie.
  command -v runsc >/dev/null 2>&1 || return 1
  local v
  v=$(dpkg-query -W -f='${Version}' runsc 2>/dev/null || true)
  dpkg --compare-versions "${v:-0}" ge "0.0~20240729"
}

if ! command -v cargo >/dev/null 2>&1 && [ ! -x "$HOME/.cargo/bin/cargo" ]; then
  echo "setup-host: no Rust toolchain found. Install one (https://rustup.rs, Rust >= 1.80) and rerun." >&2
  exit 1
fi

# Cgroup task migrations without an RCU grace period each. Every sandbox
# start moves processes between cgroups (runsc joins its own; the shim
# moves the guest's into their memory cgroup, hatchery-runtime-gvisor
# memcg.rs), and by default each move waits a grace period: 10-12 ms of
# every restore here. The cgroup v2 mount option favordynmods puts the
# kernel's threadgroup lock, which every hierarchy (v1 too) shares, in the
# mode where a move does not wait; forks and exits cost slightly more.
# Measured (docs/benchmarks.md): the shim's memcg step 10.9 -> 0.3 ms, raw
# runsc restore 165 -> 152 ms. A remount does not survive a reboot; the
# kernel parameter cgroup_favordynmods=true does (docs/operations.md).
# Best effort: a host without it works, starts are only slower.
favor_dynmods() {
  grep -qsw favordynmods /sys/kernel/cgroup/features || return 0
  local mnt
  mnt=$(awk '$3 == "cgroup2" {print $2; exit}' /proc/mounts)
  [ -n "$mnt" ] || return 0
  awk -v m="$mnt" '$2 == m && $3 == "cgroup2" {print $4}' /proc/mounts | grep -qw favordynmods && return 0
  [ "$(id -u)" = 0 ] || { echo "setup-host: as root, would remount $mnt with favordynmods (faster sandbox starts)" >&2; return 0; }
  mount -o remount,favordynmods "$mnt" \
    || echo "setup-host: could not remount $mnt with favordynmods; sandbox starts wait an RCU grace period per cgroup move" >&2
}
favor_dynmods

missing=()
command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
command -v nft >/dev/null 2>&1 || missing+=(nftables)
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
command -v sqlite3 >/dev/null 2>&1 || missing+=(sqlite3)
command -v curl >/dev/null 2>&1 || missing+=(curl)
command -v conntrack >/dev/null 2>&1 || missing+=(conntrack)
# The egress tests make a test CA and serve git over HTTPS (tests/egress).
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
command -v git >/dev/null 2>&1 || missing+=(git)
# PostgreSQL for the tests of the shared (many-hosts) stores; the tests run
# their own server as the postgres user (tests/pg/pg.py), never the system one.
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing+=(postgresql)
# The fault harness runs a host with its wall clock skewed (tests/store/test_faults.py).
command -v faketime >/dev/null 2>&1 || missing+=(faketime)
/usr/bin/python3 -c 'import pytest' >/dev/null 2>&1 || missing+=(python3-pytest)
# Every pytest suite runs under a per-test timeout, so a hang fails fast.
/usr/bin/python3 -c 'import pytest_timeout' >/dev/null 2>&1 || missing+=(python3-pytest-timeout)
# The Python SDK suite pip-installs the package, offline, into a venv that
# sees the system packages (make sdk-python-test): venv, and wheel to build it.
/usr/bin/python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || missing+=(python3-venv)
/usr/bin/python3 -c 'import wheel' >/dev/null 2>&1 || missing+=(python3-wheel)
# Templates with a `pip` list are installed into their rootfs by the host's
# Debian pip (the same Python as the rootfs).
/usr/bin/python3 -m pip --version >/dev/null 2>&1 || missing+=(python3-pip)
# Headless browser for the playground widget's tests (driven over CDP).
[ -x /usr/lib/chromium/chromium ] || command -v chromium >/dev/null 2>&1 || missing+=(chromium)

if runsc_ok && [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
need_root

if ! runsc_ok; then
  # Pin trixie low so that only what we ask for by name comes from it.
  src=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
  src=${src:-http://deb.debian.org/debian}
  if [ ! -f /etc/apt/sources.list.d/trixie.sources ]; then
    cat > /etc/apt/sources.list.d/trixie.sources <<SRC
Types: deb
URIs: $src
Suites: trixie
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
  fi
  cat > /etc/apt/preferences.d/trixie.pref <<PREF
Package: *
Pin: release n=trixie
Pin-Priority: 100
PREF
fi

export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
if [ ${#missing[@]} -gt 0 ]; then
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
if ! runsc_ok; then
  apt-get install -y -qq --no-install-recommends -t trixie runsc
fi
runsc --version | head -1
