#!/usr/bin/env bash
# Proves the .deb on this machine (root, Debian): it refuses another Slurm
# release, installs, passes the end-to-end suite from the installed files, and
# removes cleanly, leaving only the configuration the admin edited.
set -euo pipefail
cd "$(dirname "$0")/.."
fail() { echo "packaging/test-install.sh: FAILED: $*" >&2; exit 1; }

packaging/build.sh
DEB=$(ls -t target/packages/spank-gpu_*.deb | head -1)
[ -f "$DEB" ] || fail "no .deb built"

# 1. Another Slurm release: the pre-install check refuses, saying why.
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
dpkg-deb -e "$DEB" "$work/ctl"
printf '#!/bin/sh\necho "slurm 23.02.7"\n' > "$work/srun"; chmod +x "$work/srun"
if out=$(PATH="$work:$PATH" sh "$work/ctl/preinst" install 2>&1); then fail "preinst accepted Slurm 23.02"; fi
echo "$out" | grep -q "built for Slurm 22.05, but this machine has Slurm 23.02" || fail "unclear refusal: $out"
echo "ok: a Slurm 23.02 machine is refused: $(echo "$out" | head -1)"

# 2. Install, and run the end-to-end suite against the installed files.
dpkg --purge spank-gpu >/dev/null 2>&1 || true
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "./$DEB" >/dev/null
PLUGIN=$(dpkg -L spank-gpu | grep '/spank_gpu.so$')
[ -x /usr/sbin/gpu-node-agent ] && [ -x /usr/bin/spank-gpu ] && [ -f "$PLUGIN" ] || fail "files missing after install"
grep -q '^optional ' /etc/slurm/plugstack.conf.d/spank-gpu.conf || fail "plugstack snippet is not 'optional'"
/usr/sbin/gpu-node-agent --help | grep -q 'scan-log' || fail "gpu-node-agent --help"
man -w gpu-node-agent >/dev/null 2>&1 || [ -f /usr/share/man/man8/gpu-node-agent.8.gz ] || fail "no man page"
SLURM_LAB_INSTALLED=1 SPANK_GPU_PLUGIN="$PLUGIN" cargo test -p slurm-lab --test e2e --quiet

# 3. Remove: nothing left but the configuration the admin edited.
echo "# tuned by the admin" >> /etc/gpu-node-agent/config.toml
FILES=$(dpkg -L spank-gpu | while read -r f; do [ -f "$f" ] && echo "$f"; done)
dpkg -r spank-gpu >/dev/null
left=$(for f in $FILES; do [ -e "$f" ] && echo "$f"; done || true)
[ "$left" = "/etc/gpu-node-agent/config.toml" ] || fail "after removal these are left: ${left:-nothing} (want only the edited config)"
echo "ok: removed; only the edited /etc/gpu-node-agent/config.toml is left"
dpkg --purge spank-gpu >/dev/null
[ ! -e /etc/gpu-node-agent/config.toml ] || fail "purge left the config"
echo "ok: purged"
