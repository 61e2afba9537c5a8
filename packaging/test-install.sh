#!/usr/bin/env bash
# Proves the packages of one Slurm release (root, Debian):
#
#   packaging/test-install.sh                 the host's Slurm (22.05): on this machine
#   packaging/test-install.sh --slurm 24.11   in the lab's Debian 13 root, never modified
#   packaging/test-install.sh --slurm 26.05   in the lab's Debian sid root, never modified
#
# Both: the maintainer scripts refuse another release before installing and warn
# after, handle the service on upgrade and removal; the .rpm's files, dependencies
# and scriptlets are checked (rpm -qpl/-qpR/--scripts).
#
# The host: installs the .deb, checks stripped programs with their debug info in
# spank-gpu-dbgsym, `systemd-analyze verify` on the unit, the installed agent's
# release check, a smoke set of the end-to-end suite from the installed files, and
# removes cleanly, leaving only the configuration the admin edited.
#
# A release's root: on an overlay of the cached root (the root is the lower layer, a
# temporary directory the upper one, in a mount namespace of its own; everything is
# unmounted and deleted at the end, also on failure), dpkg -i's the .deb beside
# Debian's Slurm packages, runs `spank-gpu --help`, `gpu-node-agent --version`, the
# agent's release check (the plugin's plugin_version against that root's `slurmd -V`)
# and that root's `srun --help` (which lists the plugin's options only if Slurm loaded
# it), purges it and checks that nothing is left; then, on a fresh overlay with
# Debian's Slurm removed and stand-ins for SchedMD's slurm-smd, slurm-smd-client and
# slurm-smd-slurmd packages, installs, checks and purges it again.
set -euo pipefail
self=$(readlink -f "$0")
cd "$(dirname "$0")/.."
fail() { echo "packaging/test-install.sh: FAILED: $*" >&2; exit 1; }
# apt waits (up to 10 min) for another apt or dpkg to finish instead of failing.
apt_get() { DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 -y -qq "$@" >/dev/null; }
UNIT=gpu-node-agent.service

WANT=
while [ $# -gt 0 ]; do
  case "$1" in
    --slurm) [ $# -ge 2 ] || fail "--slurm needs a release (24.11, 26.05)"; WANT=$2; shift 2 ;;
    --slurm=*) WANT=${1#--slurm=}; shift ;;
    *) fail "unknown argument '$1' (usage: packaging/test-install.sh [--slurm X.Y])" ;;
  esac
done
case "$WANT" in
  24.11) SUITE=trixie ;;
  26.05) SUITE=sid ;;
  "" | 22.05) SUITE= ;;
  *) fail "--slurm $WANT: the releases are 22.05 (the host), 24.11 and 26.05 (the lab's Debian roots)" ;;
esac
ROOT=
if [ -n "$SUITE" ]; then
  ROOT=${SLURM_LAB_ROOTS:-/var/cache/slurm-lab/roots}/$SUITE
  [ -x "$ROOT/usr/sbin/slurmd" ] || fail "no Slurm $WANT root at $ROOT: make it first (target/debug/slurm-lab root $WANT)"
  # Everything from here runs in a mount namespace of its own: the overlays and
  # their /proc, /dev, /sys go away with it, whatever happens to this script.
  if [ -z "${SPANK_GPU_TEST_NS:-}" ]; then
    exec unshare --mount --propagation private env SPANK_GPU_TEST_NS=1 "$self" --slurm "$WANT"
  fi
fi

args=()
[ -n "$WANT" ] && args=(--slurm "$WANT")
manifest=$(packaging/build.sh "${args[@]}" | tee >(cat >&2) | sed -n 's/^listed in //p')
[ -f "$manifest" ] || fail "packaging/build.sh listed no packages"
# shellcheck source=/dev/null
. "$manifest"
[ -f "$DEB" ] && [ -f "$DBG_DEB" ] || fail "no .deb or -dbgsym .deb built"
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)

work=$(mktemp -d /tmp/spank-gpu-test-install.XXXXXX)
MOUNTS=()
cleanup() {
  local i
  for ((i = ${#MOUNTS[@]} - 1; i >= 0; i--)); do
    umount "${MOUNTS[i]}" 2>/dev/null || umount -l "${MOUNTS[i]}" 2>/dev/null || true
  done
  # --one-file-system: never into a mount that is somehow still there (a bound /dev).
  rm -rf --one-file-system "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---------- the maintainer scripts, on this machine, with stand-in commands ----------
# 1. Another Slurm release: the pre-install check refuses, the post-install one
#    warns; both name the package to install.
dpkg-deb -e "$DEB" "$work/ctl"
mkdir -p "$work/other" "$work/bin"
printf '#!/bin/sh\necho "slurm 23.02.7"\n' > "$work/other/srun"
printf '#!/bin/sh\nexit 1\n' > "$work/other/scontrol"
chmod +x "$work/other/srun" "$work/other/scontrol"
cp "$work/other/scontrol" "$work/bin/scontrol"   # no controller asked for its PluginDir
if out=$(PATH="$work/other:$PATH" sh "$work/ctl/preinst" install 2>&1); then fail "preinst accepted Slurm 23.02"; fi
grep -q "built for Slurm $SLURM, but this machine has Slurm 23.02" <<<"$out" || fail "unclear refusal: $out"
grep -qF "install spank-gpu_$VERSION-1+slurm23.02 (.deb)" <<<"$out" || fail "the refusal names no package: $out"
echo "ok: a Slurm 23.02 machine is refused: $(echo "$out" | head -1)"

# 2. The maintainer scripts with systemd running (in a private mount
#    namespace: a tmpfs /run with /run/systemd/system, and the systemd tools
#    replaced by ones that record their calls).
for t in systemctl deb-systemd-invoke deb-systemd-helper; do
  printf '#!/bin/sh\necho "%s $*" >> "%s/calls"\n' "$t" "$work" > "$work/bin/$t"; chmod +x "$work/bin/$t"
done
scripted() { # scripted SCRIPT ARGS... -> the systemd calls it made
  : > "$work/calls"
  unshare -m sh -c 'mount -t tmpfs tmpfs /run && mkdir -p /run/systemd/system && PATH="$0/bin:$PATH" sh "$@"' \
    "$work" "$work/ctl/$@" >/dev/null 2>&1 || fail "$* failed"
  cat "$work/calls"
}
{
  calls=$(scripted postinst configure)
  grep -q "deb-systemd-invoke" <<<"$calls" && fail "a fresh install started the agent: $calls"
  grep -q "deb-systemd-helper update-state $UNIT" <<<"$calls" || fail "postinst did not record the unit: $calls"
  calls=$(scripted postinst configure 0.0.9-1+slurm22.05)
  grep -q "deb-systemd-invoke try-restart $UNIT" <<<"$calls" || fail "an upgrade does not restart the agent: $calls"
  calls=$(scripted prerm remove)
  grep -q "deb-systemd-invoke stop $UNIT" <<<"$calls" || fail "removal does not stop the agent: $calls"
  calls=$(scripted prerm upgrade 0.1.0)
  [ -z "$calls" ] || fail "prerm upgrade stopped the agent (postinst restarts it): $calls"
  echo "ok: maintainer scripts: fresh install leaves the agent alone, upgrade try-restarts it, removal stops it"
  # A Slurm of another release installed since the check before unpacking (or
  # forced past it): the postinst says so, and which package fits, and succeeds.
  : > "$work/calls"
  out=$(unshare -m sh -c 'mount -t tmpfs tmpfs /run && PATH="$0/bin:$0/other:$PATH" sh "$0/ctl/postinst" configure' "$work" 2>&1) ||
    fail "postinst failed on another release: $out"
  grep -q "built for Slurm $SLURM, but this machine has Slurm 23.02" <<<"$out" || fail "postinst is silent about Slurm 23.02: $out"
  grep -q "jobs run without --auto-rdzv and --gpu-affinity" <<<"$out" || fail "postinst does not say what it means: $out"
  echo "ok: the postinst warns: $(echo "$out" | sed -n 2p)"
}

# The Prometheus rules as installed (PATH, and where from): Prometheus's own checker
# (promtool, from Debian's prometheus package on this machine) accepts them.
check_prom_rules() { # check_prom_rules PATH WHERE
  command -v promtool >/dev/null || fail "promtool not found: apt-get install prometheus (tests/run installs it)"
  local out
  out=$(promtool check rules "$1" 2>&1) || fail "promtool check rules on the $2's $PROM_RULES: $out"
  echo "ok: the $2's Prometheus rules: $(grep -o 'SUCCESS.*' <<<"$out")"
}

# ---------- the .rpm ----------
check_rpm() {
  [ -n "$RPM" ] || { echo "note: no .rpm built (rpmbuild missing)"; return 0; }
  local requires scripts files release
  release=$(rpm -qp --qf '%{RELEASE}' "$RPM" 2>/dev/null)
  [ "$release" = "1.slurm$SLURM" ] || fail "the .rpm's release is $release, not 1.slurm$SLURM"
  requires=$(rpm -qpR "$RPM" 2>/dev/null)
  local next
  next=$(echo "$SLURM" | awk -F. '{printf "%d.%02d", $1, $2 + 1}')
  for req in 'libhwloc.so.15()(64bit)' 'libudev.so.1()(64bit)' "slurm >= $SLURM" "slurm < $next"; do
    grep -qF "$req" <<<"$requires" || fail "the .rpm does not require $req: $requires"
  done
  scripts=$(rpm -qp --scripts "$RPM" 2>/dev/null)
  grep -q "disable --now $UNIT" <<<"$scripts" || fail "the .rpm does not stop and disable the agent on removal"
  grep -q "try-restart $UNIT" <<<"$scripts" || fail "the .rpm does not restart the agent on upgrade"
  grep -q "built for Slurm $SLURM, but this machine has Slurm" <<<"$scripts" || fail "the .rpm does not check the release"
  files=$(rpm -qpl "$RPM" 2>/dev/null)
  for f in /usr/lib64/slurm/spank_gpu.so /usr/sbin/gpu-node-agent /usr/bin/spank-gpu \
    /etc/slurm/plugstack.conf.d/spank-gpu.conf /etc/gpu-node-agent/config.toml /lib/systemd/system/$UNIT "$PROM_RULES" \
    /usr/libexec/spank-gpu/epilog; do
    grep -qx "$f" <<<"$files" || fail "the .rpm has no $f: $files"
  done
  grep -q '^/usr/lib/debug' <<<"$files" && fail "the .rpm carries debug info"
  files=$([ -n "$DEBUGINFO_RPM" ] && rpm -qpl "$DEBUGINFO_RPM" 2>/dev/null || true)
  grep -qx "/usr/lib/debug/usr/lib64/slurm/spank_gpu.so.debug" <<<"$files" || fail "no -debuginfo .rpm with the plugin's debug info"
  [ "$(rpm -qp --qf '%{NAME}-%{VERSION}-%{RELEASE}' "$RPM")" = "spank-gpu-$VERSION-1.slurm$SLURM" ] ||
    fail "the .rpm is not the spank-gpu-$VERSION-1.slurm$SLURM the agent names"
  echo "ok: .rpm $(basename "$RPM"): requires slurm >= $SLURM, < $next, hwloc's and udev's libraries; the plugin in /usr/lib64/slurm; stops/disables on removal, restarts on upgrade"
}
check_rpm

# The installed agent's release check: `status` (NVML and Slurm absent: it cannot
# tell the GPUs' health, and says so) reads /etc/slurm/plugstack.conf and its
# includes, the plugin's plugin_version, and `slurmd -V`. In CMD's world (`chroot
# ROOT` or nothing), its line for the plugin must say `ok` for slurmd's release.
agent_release_line() { # agent_release_line RUN... -> the status line about the plugin
  local state=/tmp/spank-gpu-agent-state.$$
  "$@" sh -c "cat > /tmp/spank-gpu-agent.toml" <<CONF
nvml_library = "/nonexistent/libnvidia-ml.so.1"
kmsg_path = ""
scontrol = "/bin/false"
scontrol_timeout = "2s"
state_dir = "$state"
node_name = "test"
CONF
  "$@" /usr/sbin/gpu-node-agent --config /tmp/spank-gpu-agent.toml status 2>/dev/null | grep '^plugin: ' || true
  "$@" rm -rf /tmp/spank-gpu-agent.toml "$state"
}

if [ -z "$ROOT" ]; then
  # ---------- the host ----------
  # 3. Install, and check what was installed.
  left=$(dpkg-query -W -f='${Package} ${db:Status-Status}\n' spank-gpu spank-gpu-dbgsym 2>/dev/null | awk '$2 != "not-installed" {print $1}' || true)
  [ -z "$left" ] || apt_get purge $left
  apt_get install "$DEB" "$DBG_DEB"   # absolute paths (build.sh lists them so)
  PLUGIN=$(dpkg -L spank-gpu | grep '/spank_gpu.so$')
  [ -x /usr/sbin/gpu-node-agent ] && [ -x /usr/bin/spank-gpu ] && [ -f "$PLUGIN" ] || fail "files missing after install"
  grep -q '^optional ' /etc/slurm/plugstack.conf.d/spank-gpu.conf || fail "plugstack snippet is not 'optional'"
  # (Captured first: with pipefail, `grep -q` closing the pipe early would fail the writer.)
  help=$(/usr/sbin/gpu-node-agent --help) && [[ $help == *scan-log* ]] || fail "gpu-node-agent --help"
  man -w gpu-node-agent >/dev/null 2>&1 || [ -f /usr/share/man/man8/gpu-node-agent.8.gz ] || fail "no man page"
  for f in "$PLUGIN" /usr/sbin/gpu-node-agent /usr/bin/spank-gpu; do
    sections=$(readelf -SW "$f")
    grep -qE '\.debug_(info|line|str) ' <<<"$sections" && fail "$f is not stripped"
    grep -q '\.symtab' <<<"$sections" && fail "$f still has its symbol table"
    grep -q '\.gnu_debuglink' <<<"$sections" || fail "$f has no .gnu_debuglink"
    debug="/usr/lib/debug$f.debug"
    [[ $(readelf -SW "$debug") == *.debug_line* ]] || fail "$debug has no line tables"
    [ "$(readelf -n "$f" | grep 'Build ID')" = "$(readelf -n "$debug" | grep 'Build ID')" ] || fail "$debug is not $f's"
  done
  exports=$(nm -D --defined-only "$PLUGIN")
  grep -q ' slurm_spank_init$' <<<"$exports" || fail "the stripped plugin lost its exports"
  [ -f "$PROM_RULES" ] || fail "no $PROM_RULES after install"
  check_prom_rules "$PROM_RULES" "installed .deb"
  # The Epilog gate with no agent running: it must pass the Epilog (exit 0), with Slurm's empty environment.
  [ -x /usr/libexec/spank-gpu/epilog ] || fail "no executable /usr/libexec/spank-gpu/epilog after install"
  env -i /usr/libexec/spank-gpu/epilog 2>/dev/null || fail "the installed Epilog gate failed with no agent running"
  echo "ok: stripped: plugin $(stat -c %s "$PLUGIN") bytes, agent $(stat -c %s /usr/sbin/gpu-node-agent) bytes; debug info in spank-gpu-dbgsym"
  line=$(agent_release_line)
  [[ $line == "plugin: $PLUGIN (optional, /etc/slurm/plugstack.conf.d/spank-gpu.conf:"*"): built for Slurm $SLURM, slurmd is $SLURM."*": ok" ]] ||
    fail "the installed agent's release check: '${line:-no line}'"
  echo "ok: the installed agent: $line"

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

  # 5. A smoke set of the end-to-end suite against the installed files: the stripped
  #    plugin's exports and options in every context, a rendezvous across nodes, a
  #    binding under task/cgroup, the installed agent draining a node, and the packaged
  #    Prometheus rules firing. The whole suite ran against the build tree just before,
  #    and the installed files are the same code (stripped): these show they are
  #    installed where Slurm, systemd and Prometheus find them and work there.
  #    The launch benchmark is `tests/run bench` (not part of the test run).
  SLURM_LAB_INSTALLED=1 SPANK_GPU_PLUGIN="$PLUGIN" cargo test -p slurm-lab --test e2e --quiet -- \
    none::plugin_exports_only_its_symbols none::options_in_every_help \
    none::ranks_meet_across_nodes_with_no_glue none::agent_xid79_through_nvml_drains_only_that_node \
    none::prometheus_alerts_fire_on_a_real_drain affinity-cgroup::affinity_tasks_bind_to_the_cpus_of_their_gpus

  # 6. Remove: the service disabled, nothing left but the configuration the admin edited.
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
  exit 0
fi

# ---------- a release's root, never modified: an overlay over it ----------
# Not in a subshell: every mount is recorded in MOUNTS for cleanup.
mount_root() { # mount_root NAME: M is the merged directory (upper and work under $work/NAME)
  local d=$work/$1
  mkdir -p "$d/upper" "$d/work" "$d/merged"
  mount -t overlay overlay -o "lowerdir=$ROOT,upperdir=$d/upper,workdir=$d/work" "$d/merged"
  MOUNTS+=("$d/merged")
  mount -t proc proc "$d/merged/proc"
  MOUNTS+=("$d/merged/proc")
  mount --bind /dev "$d/merged/dev"
  MOUNTS+=("$d/merged/dev")
  mount --bind -o ro /sys "$d/merged/sys"
  MOUNTS+=("$d/merged/sys")
  M=$d/merged
}
# A command in the root, with a clean environment (no $SLURM_CONF of the host's).
in_root() { # in_root MERGED CMD...
  local m=$1; shift
  chroot "$m" env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
    DEBIAN_FRONTEND=noninteractive "$@"
}
# A slurm.conf that srun can read (no controller needed for --help).
slurm_conf() { # slurm_conf MERGED
  cat > "$1/etc/slurm/slurm.conf" <<CONF
ClusterName=spank-gpu-test
SlurmctldHost=localhost
NodeName=node1 CPUs=1 State=UNKNOWN
PartitionName=debug Nodes=node1 Default=YES
CONF
}
# What an install left in the upper layer beyond dpkg's own records, the files this
# test wrote itself, and the directories the overlay copied up; and what it deleted
# from the root (a whiteout), beyond the agent's state directory, which the purge
# removes by design (the lab's roots have one).
leftovers() { # leftovers NAME
  (cd "$work/$1/upper" && find . -not -type d \
    -not -path './var/lib/dpkg/*' -not -path './var/log/*' -not -path './tmp/*' -not -path './var/cache/debconf/*' \
    -not -path './etc/slurm/slurm.conf' -not -path './etc/ld.so.cache' -not -path './var/cache/ldconfig/*' -not -path './var/cache/man/*' \
    -not \( -type c -path './var/lib/gpu-node-agent' \) -printf '%y %p\n' | sed 's/^c /deleted /; s/^[^d][^ ]* /left /' | sort)
}

SLURMD_SAYS=$(chroot "$ROOT" slurmd -V)
SLURMD_VERSION=${SLURMD_SAYS##* }
[ "${SLURMD_VERSION%.*}" = "$SLURM" ] || fail "$ROOT's slurmd is $SLURMD_SAYS, not Slurm $SLURM"
DEB_NAME=$(basename "$DEB")
DBG_NAME=$(basename "$DBG_DEB")

# 3. Beside Debian's Slurm packages.
mount_root debian
cp "$DEB" "$DBG_DEB" "$M/tmp/"
slurm_conf "$M"
out=$(in_root "$M" dpkg -i "/tmp/$DEB_NAME" "/tmp/$DBG_NAME" 2>&1) || fail "dpkg -i in $ROOT: $out"
grep -q "but this machine has Slurm" <<<"$out" && fail "the postinst warns about the root's own release: $out"
FILES=$(in_root "$M" dpkg -L spank-gpu spank-gpu-dbgsym | while read -r f; do [ -f "$M$f" ] && echo "$f"; done)
PLUGIN=$DEB_PLUGDIR/spank_gpu.so
for f in "$PLUGIN" /usr/sbin/gpu-node-agent /usr/bin/spank-gpu /etc/slurm/plugstack.conf.d/spank-gpu.conf \
  /etc/gpu-node-agent/config.toml /lib/systemd/system/$UNIT "/usr/lib/debug$PLUGIN.debug" "$PROM_RULES"; do
  grep -qx "$f" <<<"$FILES" || fail "spank-gpu installed no $f in $ROOT"
done
check_prom_rules "$M$PROM_RULES" ".deb in $ROOT"
# spank-gpu --help prints its usage on stdout and exits 0 (a usage error exits 2).
help=$(in_root "$M" spank-gpu --help 2>&1) && [[ $help == *"spank-gpu explain"* ]] || fail "spank-gpu --help in $ROOT: $help"
said=$(in_root "$M" gpu-node-agent --version) && [ "$said" = "gpu-node-agent $VERSION" ] || fail "gpu-node-agent --version in $ROOT: $said"
echo "ok: installed beside Debian's Slurm $SLURMD_VERSION in $ROOT (an overlay); spank-gpu --help, $said"
line=$(agent_release_line in_root "$M")
[[ $line == "plugin: $PLUGIN (optional, /etc/slurm/plugstack.conf.d/spank-gpu.conf:"*"): built for Slurm $SLURM, slurmd is $SLURMD_VERSION: ok" ]] ||
  fail "the agent's release check in $ROOT: '${line:-no line}'"
echo "ok: the agent in $ROOT: $line"
help=$(in_root "$M" srun --help 2>&1) || fail "srun --help in $ROOT: $help"
[[ $help == *--auto-rdzv* && $help == *--gpu-affinity* ]] || fail "$ROOT's srun --help lists no plugin option (not loaded?): $help"
[[ $help == *Incompatible* || $help == *error:* ]] && fail "$ROOT's srun complains: $(grep -E 'Incompatible|error:' <<<"$help")"
echo "ok: $ROOT's srun $SLURMD_VERSION loads the plugin: --help lists --auto-rdzv and --gpu-affinity"
out=$(in_root "$M" dpkg --purge spank-gpu-dbgsym spank-gpu 2>&1) || fail "dpkg --purge in $ROOT: $out"
left=$(for f in $FILES; do [ -e "$M$f" ] && echo "$f"; done || true)
[ -z "$left" ] || fail "purge left in $ROOT: $left"
left=$(leftovers debian)
[ -z "$left" ] || fail "the install left in $ROOT's upper layer: $left"
echo "ok: purged from $ROOT; nothing left beside dpkg's records"

# 4. Beside SchedMD's packages: a fresh overlay, Debian's Slurm removed, and stand-ins
#    named and related as SchedMD's debs are (debian/control at slurm-24-11-5-1 and
#    slurm-26-05-3-1: slurm-smd Conflicts slurm-wlm and its plugins, slurm-smd-client
#    Conflicts slurm-client, slurm-smd-slurmd Conflicts slurmd, each Depends on
#    slurm-smd of its version; no Provides), with the commands that print the release
#    as SchedMD's builds do (`slurm 24.11.5`).
mount_root schedmd
cp "$DEB" "$M/tmp/"
debian=$(in_root "$M" dpkg-query -W -f='${Package} ${db:Status-Status}\n' 'slurm*' 'libslurm-dev' 2>/dev/null |
  awk '$2 == "installed" {print $1}')
out=$(in_root "$M" dpkg --purge --force-depends $debian 2>&1) || fail "removing Debian's Slurm from the overlay: $out"
[ ! -e "$M/etc/slurm/plugstack.conf" ] || fail "Debian's plugstack.conf is still there"
SMD_VERSION=$SLURMD_VERSION-1
standin() { # standin PACKAGE "CONTROL LINES" FILE:SCRIPT...
  local pkg=$1 control=$2 d=$work/standin/$1 spec
  shift 2
  mkdir -p "$d/DEBIAN"
  printf 'Package: %s\nVersion: %s\nArchitecture: all\nMaintainer: stand-in <test@localhost>\n%sDescription: stand-in for SchedMD'"'"'s %s (packaging/test-install.sh)\n' \
    "$pkg" "$SMD_VERSION" "$control" "$pkg" > "$d/DEBIAN/control"
  for spec in "$@"; do
    install -D -m 0755 /dev/stdin "$d${spec%%:*}" <<<"${spec#*:}"
  done
  dpkg-deb --root-owner-group --build "$d" "$M/tmp/$pkg.deb" >/dev/null
}
TRIPLET=$(basename "$(dirname "$DEB_PLUGDIR")")
standin slurm-smd "Conflicts: slurm-wlm, slurm-wlm-basic-plugins, slurm-wlm-plugins
" "/usr/lib/$TRIPLET/slurm/README.stand-in:#!/bin/sh"
standin slurm-smd-client "Depends: slurm-smd (= $SMD_VERSION)
Conflicts: slurm-client, slurm-client-emulator
" "/usr/bin/srun:#!/bin/sh
echo 'slurm $SLURMD_VERSION'" "/usr/bin/scontrol:#!/bin/sh
echo 'slurm_load_ctl_conf error: Unable to contact slurm controller (connect failure)' >&2; exit 1"
standin slurm-smd-slurmd "Depends: slurm-smd (= $SMD_VERSION)
Conflicts: slurmd
" "/usr/sbin/slurmd:#!/bin/sh
[ \"\$1\" = -V ] && echo 'slurm $SLURMD_VERSION'"
out=$(in_root "$M" dpkg -i /tmp/slurm-smd.deb /tmp/slurm-smd-client.deb /tmp/slurm-smd-slurmd.deb 2>&1) ||
  fail "installing the slurm-smd stand-ins: $out"
out=$(in_root "$M" dpkg -i "/tmp/$DEB_NAME" 2>&1) || fail "dpkg -i beside slurm-smd: $out"
grep -q "Slurm's PluginDir is /usr/lib/$TRIPLET/slurm: linked" <<<"$out" || fail "the postinst did not find SchedMD's PluginDir: $out"
grep -q "does not include /etc/slurm/plugstack.conf.d/\*.conf" <<<"$out" || fail "the postinst does not say the snippet is not read: $out"
link=/usr/lib/$TRIPLET/slurm/spank_gpu.so
[ "$(readlink "$M$link")" = "$PLUGIN" ] || fail "$link is not a link to $PLUGIN"
echo "include /etc/slurm/plugstack.conf.d/*.conf" > "$M/etc/slurm/plugstack.conf"   # as the note says
line=$(agent_release_line in_root "$M")
[[ $line == "plugin: $PLUGIN (optional, /etc/slurm/plugstack.conf.d/spank-gpu.conf:"*"): built for Slurm $SLURM, slurmd is $SLURMD_VERSION: ok" ]] ||
  fail "the agent's release check beside slurm-smd: '${line:-no line}'"
echo "ok: installed beside SchedMD-style slurm-smd $SMD_VERSION (stand-ins): the plugin linked into $link, the missing include said, the agent: ok"
out=$(in_root "$M" dpkg --purge spank-gpu 2>&1) || fail "dpkg --purge beside slurm-smd: $out"
for f in "$link" "$PLUGIN" /usr/sbin/gpu-node-agent /etc/slurm/plugstack.conf.d/spank-gpu.conf /etc/gpu-node-agent /var/lib/spank-gpu; do
  [ ! -e "$M$f" ] && [ ! -L "$M$f" ] || fail "purge beside slurm-smd left $f"
done
echo "ok: purged beside slurm-smd: the link and every file gone"
echo "ok: Slurm $SLURM packages: $(basename "$DEB"), ${RPM:+$(basename "$RPM")}"
