#!/usr/bin/env bash
# Bakes the default `code-interpreter` template: a Debian bookworm rootfs with
# python3, coreutils and procps. The guest agent is not copied in: the runtime
# bind-mounts the current agent binary read-only, so a rebuilt agent never
# needs a re-bake. Reused across runs; builds into a temp dir and renames, so
# an interrupted bake never leaves a half rootfs that looks finished.
set -euo pipefail
templates=${1:?usage: bake-template.sh TEMPLATES_DIR}
name=code-interpreter
dest="$templates/$name"
if [ -f "$dest/template.json" ] && [ -x "$dest/rootfs/usr/bin/python3" ]; then
  exit 0
fi
mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
mirror=${mirror:-http://deb.debian.org/debian}
mkdir -p "$dest"
tmp="$dest/rootfs.partial"
rm -rf "$tmp"
echo "bake-template: debootstrap bookworm into $tmp (about a minute)" >&2
debootstrap --variant=minbase --include=python3,procps bookworm "$tmp" "$mirror" >"$dest/bake.log" 2>&1 \
  || { echo "bake-template: debootstrap failed, see $dest/bake.log" >&2; exit 1; }
# Trim what a sandbox never needs: apt caches and docs.
rm -rf "$tmp"/var/cache/apt/archives/*.deb "$tmp"/var/lib/apt/lists/* "$tmp"/usr/share/doc "$tmp"/usr/share/man
mkdir -p "$tmp/opt/hatchery" "$tmp/workspace"
rm -rf "$dest/rootfs"
mv "$tmp" "$dest/rootfs"
cat > "$dest/template.json" <<JSON
{
  "name": "$name",
  "cpus": 1.0,
  "memory_mb": 512,
  "pids_max": 256,
  "disk_mb": 256
}
JSON
echo "bake-template: $name ready in $dest" >&2
