#!/usr/bin/env bash
# Proves the .deb on this machine (root, Debian): it refuses another Slurm
# release, installs, ships stripped programs with their debug info in
# spank-gpu-dbgsym, has a systemd unit that `systemd-analyze verify` accepts,
# handles the service on upgrade and removal, passes the end-to-end suite from
# the installed files, and removes cleanly, leaving only the configuration the
# admin edited. Checks the .rpm's dependencies and scriptlets when one was
# built, and prints the launch benchmark of the installed plugin.
set -euo pipefail
cd "$(dirname "$0")/.."
fail() { echo "packaging/test-install.sh: FAILED: $*" >&2; exit 1; }
# apt waits (up to 10 min) for another apt or dpkg to finish instead of failing.
apt_get() { DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 -y -qq "$@" >/dev/null; }
UNIT=gpu-node-agent.service

packaging/build.sh
DEB=$(ls -t target/packages/spank-gpu_*.deb | head -1)
DBG=$(ls -t target/packages/spank-gpu-dbgsym_*.deb | head -1)
[ -f "$DEB" ] && [ -f "$DBG" ] || fail "no .deb or -dbgsym .deb built"

# 1. Another Slurm release: the pre-install check refuses, saying why.
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
dpkg-deb -e "$DEB" "$work/ctl"
printf '#!/bin/sh\necho "slurm 23.02.7"\n' > "$work/srun"; chmod +x "$work/srun"
if out=$(PATH="$work:$PATH" sh "$work/ctl/preinst" install 2>&1); then fail "preinst accepted Slurm 23.02"; fi
echo "$out" | grep -q "built for Slurm 22.05, but this machine has Slurm 23.02" || fail "unclear refusal: $out"
echo "ok: a Slurm 23.02 machine is refused: $(echo "$out" | head -1)"

# 2. The maintainer scripts with systemd running (in a private mount
#    namespace: a tmpfs /run with /run/systemd/system, and the systemd tools
#    replaced by ones that record their calls).
mkdir -p "$work/bin"
for t in systemctl deb-systemd-invoke deb-systemd-helper; do
  printf '#!/bin/sh\necho "%s $*" >> "%s/calls"\n' "$t" "$work" > "$work/bin/$t"; chmod +x "$work/bin/$t"
done
scripted() { # scripted SCRIPT ARGS... -> the systemd calls it made
  : > "$work/calls"
  unshare -m sh -c 'mount -t tmpfs tmpfs /run && mkdir -p /run/systemd/system && PATH="$0/bin:$PATH" sh "$@"' \
    "$work" "$work/ctl/$@" >/dev/null 2>&1 || fail "$* failed"
  cat "$work/calls"
}
calls=$(scripted postinst configure)
echo "$calls" | grep -q "deb-systemd-invoke" && fail "a fresh install started the agent: $calls"
echo "$calls" | grep -q "deb-systemd-helper update-state $UNIT" || fail "postinst did not record the unit: $calls"
calls=$(scripted postinst configure 0.0.9-1+slurm22.05)
echo "$calls" | grep -q "deb-systemd-invoke try-restart $UNIT" || fail "an upgrade does not restart the agent: $calls"
calls=$(scripted prerm remove)
echo "$calls" | grep -q "deb-systemd-invoke stop $UNIT" || fail "removal does not stop the agent: $calls"
calls=$(scripted prerm upgrade 0.1.0)
[ -z "$calls" ] || fail "prerm upgrade stopped the agent (postinst restarts it): $calls"
echo "ok: maintainer scripts: fresh install leaves the agent alone, upgrade try-restarts it, removal stops it"

# 3. Install, and check what was installed.
left=$(dpkg-query -W -f='${Package} ${db:Status-Status}\n' spank-gpu spank-gpu-dbgsym 2>/dev/null | awk '$2 != "not-installed" {print $1}' || true)
[ -z "$left" ] || apt_get purge $left
apt_get install "./$DEB" "./$DBG"
PLUGIN=$(dpkg -L spank-gpu | grep '/spank_gpu.so$')
[ -x /usr/sbin/gpu-node-agent ] && [ -x /usr/bin/spank-gpu ] && [ -f "$PLUGIN" ] || fail "files missing after install"
grep -q '^optional ' /etc/slurm/plugstack.conf.d/spank-gpu.conf || fail "plugstack snippet is not 'optional'"
# (Captured first: with pipefail, `grep -q` closing the pipe early would fail the writer.)
help=$(/usr/sbin/gpu-node-agent --help) && [[ $help == *scan-log* ]] || fail "gpu-node-agent --help"
man -w gpu-node-agent >/dev/null 2>&1 || [ -f /usr/share/man/man8/gpu-node-agent.8.gz ] || fail "no man page"
for f in "$PLUGIN" /usr/sbin/gpu-node-agent /usr/bin/spank-gpu; do
  sections=$(readelf -SW "$f")
  echo "$sections" | grep -qE '\.debug_(info|line|str) ' && fail "$f is not stripped"
  echo "$sections" | grep -q '\.symtab' && fail "$f still has its symbol table"
  echo "$sections" | grep -q '\.gnu_debuglink' || fail "$f has no .gnu_debuglink"
  debug="/usr/lib/debug$f.debug"
  [[ $(readelf -SW "$debug") == *.debug_line* ]] || fail "$debug has no line tables"
  [ "$(readelf -n "$f" | grep 'Build ID')" = "$(readelf -n "$debug" | grep 'Build ID')" ] || fail "$debug is not $f's"
done
exports=$(nm -D --defined-only "$PLUGIN")
grep -q ' slurm_spank_init$' <<<"$exports" || fail "the stripped plugin lost its exports"
echo "ok: stripped: plugin $(stat -c %s "$PLUGIN") bytes, agent $(stat -c %s /usr/sbin/gpu-node-agent) bytes; debug info in spank-gpu-dbgsym"

# 4. The unit: systemd accepts it as it is (a warning is a failure), and it
#    keeps the agent's access to the kernel log and the GPUs.
out=$(systemd-analyze verify --man=no "/lib/systemd/system/$UNIT" 2>&1) || fail "systemd-analyze verify: $out"
[ -z "$out" ] || fail "systemd-analyze verify complains: $out"
for key in Type=notify WatchdogSec= ProtectSystem=strict ReadWritePaths= ProtectKernelTunables=yes \
  ProtectKernelModules=yes ProtectControlGroups=yes RestrictNamespaces=yes LockPersonality=yes \
  MemoryMax= TasksMax= OOMScoreAdjust= After=.*munge.service Before=slurmd.service; do
  grep -q "^$key" "/lib/systemd/system/$UNIT" || fail "the unit has no $key"
done
grep -qE '^(ProtectKernelLogs|PrivateDevices)=yes' "/lib/systemd/system/$UNIT" && fail "the unit hides /dev/kmsg or the GPUs"
echo "ok: systemd-analyze verify accepts the unit"

# 5. The end-to-end suite against the installed files.
SLURM_LAB_INSTALLED=1 SPANK_GPU_PLUGIN="$PLUGIN" cargo test -p slurm-lab --test e2e --quiet

# 6. The launch cost of the installed (stripped) plugin, against no plugin and
#    the unstripped build: a benchmark, its figures printed, nothing asserted.
SPANK_GPU_PLUGIN="$PLUGIN" cargo run --quiet -p slurm-lab --bin slurm-lab -- \
  bench "${SPANK_GPU_BENCH_RUNS:-30}" --compare target/release/libspank_gpu.so

# 7. Remove: the service disabled, nothing left but the configuration the admin edited.
systemctl enable "$UNIT" >/dev/null 2>&1  # an admin enabling it; works without a running systemd
[ -L "/etc/systemd/system/multi-user.target.wants/$UNIT" ] || fail "could not enable the unit for the removal test"
echo "# tuned by the admin" >> /etc/gpu-node-agent/config.toml
FILES=$(dpkg -L spank-gpu | while read -r f; do [ -f "$f" ] && echo "$f"; done)
apt_get remove spank-gpu-dbgsym spank-gpu
left=$(for f in $FILES; do [ -e "$f" ] && echo "$f"; done || true)
[ "$left" = "/etc/gpu-node-agent/config.toml" ] || fail "after removal these are left: ${left:-nothing} (want only the edited config)"
[ ! -e "/etc/systemd/system/multi-user.target.wants/$UNIT" ] || fail "removal left the unit enabled"
echo "ok: removed and disabled; only the edited /etc/gpu-node-agent/config.toml is left"
apt_get purge spank-gpu
[ ! -e /etc/gpu-node-agent/config.toml ] || fail "purge left the config"
echo "ok: purged"

# 8. The .rpm, when built: rpm found the libraries, the service is handled.
RPM=$(ls -t target/packages/spank-gpu-[0-9]*.rpm 2>/dev/null | head -1 || true)
if [ -n "$RPM" ]; then
  requires=$(rpm -qp --requires "$RPM" 2>/dev/null)
  for lib in 'libhwloc.so.15()(64bit)' 'libudev.so.1()(64bit)' 'slurm >= 22.05'; do
    echo "$requires" | grep -qF "$lib" || fail "the .rpm does not require $lib: $requires"
  done
  scripts=$(rpm -qp --scripts "$RPM" 2>/dev/null)
  echo "$scripts" | grep -q "disable --now $UNIT" || fail "the .rpm does not stop and disable the agent on removal"
  echo "$scripts" | grep -q "try-restart $UNIT" || fail "the .rpm does not restart the agent on upgrade"
  files=$(rpm -qpl "$RPM" 2>/dev/null)
  grep -q '^/usr/lib/debug' <<<"$files" && fail "the .rpm carries debug info"
  ls target/packages/spank-gpu-debuginfo-*.rpm >/dev/null 2>&1 || fail "no -debuginfo .rpm"
  echo "ok: .rpm requires hwloc's and udev's libraries, stops/disables on removal, restarts on upgrade"
fi
