#!/usr/bin/env bash
# Builds the spank-gpu packages for one Slurm release:
#   packaging/build.sh                the host's Slurm (its headers in /usr/include,
#                                     or in $SLURM_INCLUDE_DIR)
#   packaging/build.sh --slurm 24.11  Slurm 24.11, from the headers of the lab's Debian 13
#                                     root (/var/cache/slurm-lab/roots/trixie)
#   packaging/build.sh --slurm 26.05  Slurm 26.05, from the Debian sid root (roots/sid)
# -> target/packages/spank-gpu_<ver>-1+slurm<X.Y>_<arch>.deb (and -dbgsym), and, when
#    rpmbuild is present, spank-gpu-<ver>-1.slurm<X.Y>.<arch>.rpm (and -debuginfo);
#    target/packages/slurm<X.Y>.files lists them for packaging/test-install.sh.
# Each release builds in its own target directory (target/slurm-<X.Y>), so building
# one never rebuilds another. The plugin only loads into the Slurm major.minor it was
# built against: one package per release.
set -euo pipefail
cd "$(dirname "$0")/.."
die() { echo "packaging/build.sh: $*" >&2; exit 1; }

WANT=
while [ $# -gt 0 ]; do
  case "$1" in
    --slurm) [ $# -ge 2 ] || die "--slurm needs a release (22.05, 24.11, 26.05)"; WANT=$2; shift 2 ;;
    --slurm=*) WANT=${1#--slurm=}; shift ;;
    *) die "unknown argument '$1' (usage: packaging/build.sh [--slurm X.Y])" ;;
  esac
done
ROOTS=${SLURM_LAB_ROOTS:-/var/cache/slurm-lab/roots}
# The releases whose headers come from one of the lab's Debian roots.
case "$WANT" in
  24.11) SUITE=trixie ;;
  26.05) SUITE=sid ;;
  *) SUITE= ;;
esac
if [ -n "${SLURM_INCLUDE_DIR:-}" ]; then
  INCLUDE=$SLURM_INCLUDE_DIR
elif [ -n "$SUITE" ]; then
  INCLUDE=$ROOTS/$SUITE/usr/include
  [ -f "$INCLUDE/slurm/slurm_version.h" ] ||
    die "no Slurm $WANT headers in $INCLUDE: make the lab's $SUITE root first (target/debug/slurm-lab root $WANT), or set SLURM_INCLUDE_DIR"
else
  INCLUDE=/usr/include
fi

VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
NUM=$(sed -n 's/^#define SLURM_VERSION_NUMBER \(0x[0-9a-fA-F]*\).*/\1/p' "$INCLUDE/slurm/slurm_version.h" 2>/dev/null || true)
if [ -z "$NUM" ]; then
  die "no SLURM_VERSION_NUMBER in $INCLUDE/slurm/slurm_version.h (install libslurm-dev, or set SLURM_INCLUDE_DIR)"
fi
MAJOR=$(( (NUM >> 16) & 0xff )); MINOR=$(( (NUM >> 8) & 0xff ))
SLURM=$(printf '%d.%02d' "$MAJOR" "$MINOR")
NEXT=$(printf '%d.%02d' "$MAJOR" "$((MINOR + 1))")
if [ -n "$WANT" ] && [ "$WANT" != "$SLURM" ]; then
  die "--slurm $WANT, but the headers in $INCLUDE are Slurm $SLURM (releases: 22.05 from the host, 24.11 from $ROOTS/trixie, 26.05 from $ROOTS/sid; or SLURM_INCLUDE_DIR)"
fi
ARCH=$(dpkg --print-architecture 2>/dev/null || uname -m)
TRIPLET=$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
BASE=${CARGO_TARGET_DIR:-target}
mkdir -p "$BASE/packages" "$BASE/slurm-$SLURM"
BASE=$(cd "$BASE" && pwd)
TARGET=$BASE/slurm-$SLURM
OUT=$BASE/packages
echo "packaging/build.sh: Slurm $SLURM (headers in $INCLUDE), building in $BASE/release, packaging in $TARGET" >&2

# One cargo target dir for every release's build: only slurm-sys reads the headers, so a
# build for another release rebuilds it and what is built on it (the plugin and the
# spank-gpu command); the agent and every other crate are built once.
SLURM_INCLUDE_DIR=$INCLUDE CARGO_TARGET_DIR=$BASE cargo build --release --locked -p spank-gpu -p spank-gpu-cli -p gpu-node-agent

# ---------- stripped programs, their debug info split off ----------
# Every program ships stripped (the plugin's 6.7 MB with debug info made each
# job step measurably slower to launch); its debug info goes to the -dbgsym
# (.deb) / -debuginfo (.rpm) package, under /usr/lib/debug/<its path>.debug,
# where gdb finds it through the program's .gnu_debuglink (or its build id).
STRIPPED=$TARGET/stripped
rm -rf "$STRIPPED"; mkdir -p "$STRIPPED"
split_debug() { # split_debug BUILT NAME
  objcopy --only-keep-debug --compress-debug-sections "$1" "$STRIPPED/$2.debug"
  objcopy --strip-all "$1" "$STRIPPED/$2"
  (cd "$STRIPPED" && objcopy --add-gnu-debuglink="$2.debug" "$2")
  chmod 0644 "$STRIPPED/$2.debug"
}
split_debug "$BASE/release/libspank_gpu.so" spank_gpu.so
split_debug "$BASE/release/gpu-node-agent" gpu-node-agent
split_debug "$BASE/release/spank-gpu" spank-gpu

# ---------- the file trees, shared by both formats ----------
# The .deb puts the plugin in Debian's plugin directory, and its plugstack line names
# it by that full path, so Slurm loads it whatever its PluginDir; where Slurm's
# PluginDir is another one (SchedMD's slurm-smd debs: /usr/lib/<triplet>/slurm), the
# postinst links it there too (plugindir_link). The .rpm puts it in SchedMD's RPMs'.
DEB_PLUGDIR=/usr/lib/$TRIPLET/slurm-wlm
RPM_PLUGDIR=/usr/lib64/slurm
programs() { # programs PLUGIN_DIR -> "NAME DIR MODE" per program
  printf '%s\n' "spank_gpu.so $1 0644" "gpu-node-agent /usr/sbin 0755" "spank-gpu /usr/bin 0755"
}
stage() { # stage ROOT PLUGIN_DIR
  local root=$1 plugdir=$2 name dir mode
  rm -rf "$root"
  programs "$plugdir" | while read -r name dir mode; do
    install -D -m "$mode" "$STRIPPED/$name" "$root$dir/$name"
  done
  sed "s#/usr/lib/x86_64-linux-gnu/slurm-wlm#$plugdir#" packaging/plugstack.conf.d/spank-gpu.conf \
    | install -D -m 0644 /dev/stdin "$root/etc/slurm/plugstack.conf.d/spank-gpu.conf"
  install -D -m 0644 packaging/config.toml "$root/etc/gpu-node-agent/config.toml"
  install -D -m 0644 packaging/systemd/gpu-node-agent.service "$root/lib/systemd/system/gpu-node-agent.service"
  # The Epilog health gate, for slurm.conf's Epilog= (docs/admin.md).
  install -D -m 0755 packaging/slurm/epilog "$root$EPILOG"
  # Prometheus rules, for the Prometheus server to load or copy (docs/admin.md, Alerts).
  install -D -m 0644 packaging/prometheus/gpu-node-agent.rules.yml "$root$PROM_RULES"
  install -d "$root/usr/share/man/man8" "$root/usr/share/man/man1"
  gzip -9n < packaging/man/gpu-node-agent.8 > "$root/usr/share/man/man8/gpu-node-agent.8.gz"
  gzip -9n < packaging/man/spank-gpu.1 > "$root/usr/share/man/man1/spank-gpu.1.gz"
  install -D -m 0644 README.md "$root/usr/share/doc/spank-gpu/README.md"
  for d in docs/*.md; do [ -e "$d" ] && install -D -m 0644 "$d" "$root/usr/share/doc/spank-gpu/$(basename "$d")"; done
  return 0
}
stage_debug() { # stage_debug ROOT PLUGIN_DIR: each program's debug info at /usr/lib/debug/<its path>.debug
  local root=$1 plugdir=$2 name dir mode
  rm -rf "$root"
  programs "$plugdir" | while read -r name dir mode; do
    install -D -m 0644 "$STRIPPED/$name.debug" "$root/usr/lib/debug$dir/$name.debug"
  done
}
UNIT=gpu-node-agent.service
PROM_RULES=/usr/share/spank-gpu/prometheus/gpu-node-agent.rules.yml
EPILOG=/usr/libexec/spank-gpu/epilog

# ---------- what the maintainer scripts say ----------
# The release check: refuse (before installing: exit 1) or warn (after: the package
# stays, Slurm leaves the plugin out). srun's release, else slurmd's; nothing when
# neither runs yet (Slurm installed in the same transaction: the postinst checks).
release_check() { # release_check refuse|warn
  local consequence
  if [ "$1" = refuse ]; then
    consequence='exit 1'
  else
    consequence='echo "spank-gpu: until then Slurm leaves the plugin out and jobs run without --auto-rdzv and --gpu-affinity (gpu-node-agent status and its metric gpu_node_agent_plugin_release say so too)." >&2'
  fi
  cat <<CHECK
have=\$( (srun --version || slurmd -V) 2>/dev/null | sed -n 's/^slurm[^ ]* \([0-9]*\)\.\([0-9]*\).*/\1.\2/p' | head -n 1)
if [ -n "\$have" ] && [ "\$have" != "$SLURM" ]; then
  echo "spank-gpu: this package was built for Slurm $SLURM, but this machine has Slurm \$have." >&2
  echo "spank-gpu: Slurm loads plugins only into the release they were built for: install spank-gpu_$VERSION-1+slurm\$have (.deb) or spank-gpu-$VERSION-1.slurm\$have (.rpm), built by \\\`packaging/build.sh --slurm \$have\\\`." >&2
  $consequence
fi
CHECK
}
# Whether Slurm reads the snippet: Debian's packages ship a plugstack.conf that
# includes plugstack.conf.d/*.conf, SchedMD's ship none.
plugstack_note() {
  cat <<'NOTE'
conf=/etc/slurm/plugstack.conf
if ! grep -Eqs '^[[:space:]]*include[[:space:]]+(/etc/slurm/)?plugstack\.conf\.d/' "$conf"; then
  echo "spank-gpu: note: $conf does not include /etc/slurm/plugstack.conf.d/*.conf, so Slurm does not read the plugin's line (/etc/slurm/plugstack.conf.d/spank-gpu.conf): add 'include /etc/slurm/plugstack.conf.d/*.conf' to $conf, or to the file slurm.conf's PlugStackConfig names (Debian's Slurm packages ship that line, SchedMD's ship no plugstack.conf)." >&2
fi
NOTE
}
# Slurm's plugin directory, found as Slurm finds it: PluginDir of the running
# configuration (`scontrol show config`), else the default of the packages Slurm came
# from (SchedMD's slurm-smd: /usr/lib/<triplet>/slurm, from their debian/rules;
# Debian's: /usr/lib/<triplet>/slurm-wlm). Where that is not where the .deb put the
# plugin, a link there makes `optional spank_gpu.so` (a name without a directory)
# work too; it is recorded, and removed with the package.
LINKS=/var/lib/spank-gpu/plugin-links
plugindir_link() {
  cat <<LINK
plugindir=\$(timeout 10 scontrol show config 2>/dev/null | sed -n 's/^PluginDir *= *\([^:]*\).*/\1/p' | head -n 1)
if [ -z "\$plugindir" ]; then
  if [ "\$(dpkg-query -W -f='\${db:Status-Status}' slurm-smd 2>/dev/null)" = installed ]; then
    plugindir=/usr/lib/$TRIPLET/slurm
  else
    plugindir=$DEB_PLUGDIR
  fi
fi
if [ "\$plugindir" != $DEB_PLUGDIR ] && [ -d "\$plugindir" ] && [ ! -e "\$plugindir/spank_gpu.so" ] && [ ! -L "\$plugindir/spank_gpu.so" ]; then
  ln -s $DEB_PLUGDIR/spank_gpu.so "\$plugindir/spank_gpu.so"
  mkdir -p ${LINKS%/*}
  echo "\$plugindir/spank_gpu.so" >> $LINKS
  echo "spank-gpu: Slurm's PluginDir is \$plugindir: linked \$plugindir/spank_gpu.so to $DEB_PLUGDIR/spank_gpu.so" >&2
fi
LINK
}
plugindir_unlink() {
  cat <<UNLINK
if [ -f $LINKS ]; then
  while read -r link; do
    if [ -L "\$link" ] && [ "\$(readlink "\$link")" = $DEB_PLUGDIR/spank_gpu.so ]; then rm -f "\$link"; fi
  done < $LINKS
  rm -f $LINKS
  rmdir ${LINKS%/*} 2>/dev/null || true
fi
UNLINK
}

# ---------- .deb ----------
DEB_VERSION="$VERSION-1+slurm$SLURM"
ROOT=$TARGET/pkgroot-deb
stage "$ROOT" "$DEB_PLUGDIR"
install -d "$ROOT/DEBIAN"
SIZE=$(du -sk "$ROOT" | cut -f1)
# Slurm's client commands come from Debian's slurm-client or from SchedMD's
# slurm-smd-client (which Conflicts: slurm-client), of this release: each bound is
# met by one of the two, and as they cannot both be installed, by the same one.
cat > "$ROOT/DEBIAN/control" <<CONTROL
Package: spank-gpu
Version: $DEB_VERSION
Architecture: $ARCH
Maintainer: spank-gpu developers <spank-gpu@localhost>
Installed-Size: $SIZE
Depends: slurm-client (>= $SLURM) | slurm-smd-client (>= $SLURM), slurm-client (<< $NEXT~) | slurm-smd-client (<< $NEXT~), libc6, libgcc-s1, libhwloc15, libudev1, init-system-helpers (>= 1.54~)
Recommends: slurmd | slurm-smd-slurmd
Section: admin
Priority: optional
Description: GPU jobs on Slurm, right the first time
 spank_gpu.so, a SPANK plugin: per-task rendezvous, rank and thread
 environment (--auto-rdzv) and GPU-aware CPU binding (--gpu-affinity).
 gpu-node-agent: finds bad GPUs (Xid, ECC, remapped rows) and drains the
 node in Slurm safely. Built for Slurm $SLURM (Debian's or SchedMD's packages).
CONTROL
printf '/etc/slurm/plugstack.conf.d/spank-gpu.conf\n/etc/gpu-node-agent/config.toml\n' > "$ROOT/DEBIAN/conffiles"
{ echo '#!/bin/sh'; echo 'set -e'; release_check refuse; } > "$ROOT/DEBIAN/preinst"
# The unit is installed, not enabled (roll out in dry-run first, docs/admin.md).
# An upgrade restarts a running agent on the new binary; removal stops and
# disables it; purge forgets it. (What dh_installsystemd --no-enable
# --restart-after-upgrade writes, by hand.)
{
  echo '#!/bin/sh'
  echo 'set -e'
  echo 'if [ "$1" = configure ]; then'
  release_check warn
  plugindir_link
  plugstack_note
  echo 'fi'
  cat <<POST
if [ "\$1" = configure ] || [ "\$1" = abort-upgrade ] || [ "\$1" = abort-deconfigure ] || [ "\$1" = abort-remove ]; then
  deb-systemd-helper unmask $UNIT >/dev/null || true
  deb-systemd-helper update-state $UNIT >/dev/null || true
  if [ -d /run/systemd/system ]; then
    systemctl --system daemon-reload >/dev/null || true
    if [ -n "\$2" ]; then deb-systemd-invoke try-restart $UNIT >/dev/null || true; fi
  fi
fi
POST
} > "$ROOT/DEBIAN/postinst"
cat > "$ROOT/DEBIAN/prerm" <<POST
#!/bin/sh
set -e
if [ "\$1" = remove ] && [ -d /run/systemd/system ]; then
  deb-systemd-invoke stop $UNIT >/dev/null || true
fi
POST
{
  echo '#!/bin/sh'
  echo 'set -e'
  echo 'if [ "$1" = remove ] || [ "$1" = purge ]; then'
  plugindir_unlink
  echo 'fi'
  cat <<POST
if [ "\$1" = remove ]; then
  # Keep only the configuration the admin edited: an unchanged plugstack
  # snippet would point Slurm at a plugin that is gone.
  dpkg-query -W -f='\${Conffiles}\n' spank-gpu 2>/dev/null | while read -r file sum rest; do
    [ -n "\$file" ] && [ -f "\$file" ] || continue
    if [ "\$(md5sum < "\$file" | cut -d' ' -f1)" = "\$sum" ]; then rm -f "\$file"; fi
  done
  if [ -x /usr/bin/deb-systemd-helper ]; then deb-systemd-helper disable $UNIT >/dev/null || true; fi
fi
if [ "\$1" = purge ]; then
  rm -rf /var/lib/gpu-node-agent /etc/gpu-node-agent /etc/slurm/plugstack.conf.d/spank-gpu.conf
  if [ -x /usr/bin/deb-systemd-helper ]; then deb-systemd-helper purge $UNIT >/dev/null || true; fi
fi
if [ -d /run/systemd/system ]; then systemctl --system daemon-reload >/dev/null || true; fi
POST
} > "$ROOT/DEBIAN/postrm"
chmod 0755 "$ROOT/DEBIAN/preinst" "$ROOT/DEBIAN/postinst" "$ROOT/DEBIAN/prerm" "$ROOT/DEBIAN/postrm"
for script in preinst postinst prerm postrm; do
  sh -n "$ROOT/DEBIAN/$script" || die "the generated $script is not valid sh"
done
DEB="$OUT/spank-gpu_${DEB_VERSION}_${ARCH}.deb"
dpkg-deb --root-owner-group -Zxz --build "$ROOT" "$DEB" >/dev/null
echo "built $DEB"

DBG_ROOT=$TARGET/pkgroot-deb-dbgsym
stage_debug "$DBG_ROOT" "$DEB_PLUGDIR"
install -d "$DBG_ROOT/DEBIAN"
cat > "$DBG_ROOT/DEBIAN/control" <<CONTROL
Package: spank-gpu-dbgsym
Version: $DEB_VERSION
Architecture: $ARCH
Maintainer: spank-gpu developers <spank-gpu@localhost>
Installed-Size: $(du -sk "$DBG_ROOT" | cut -f1)
Depends: spank-gpu (= $DEB_VERSION)
Section: debug
Priority: optional
Description: debug symbols for spank-gpu
 The debug info split off spank_gpu.so, gpu-node-agent and spank-gpu.
CONTROL
DBG_DEB="$OUT/spank-gpu-dbgsym_${DEB_VERSION}_${ARCH}.deb"
dpkg-deb --root-owner-group -Zxz --build "$DBG_ROOT" "$DBG_DEB" >/dev/null
echo "built $DBG_DEB"

# ---------- .rpm ----------
RPM= DEBUGINFO_RPM=
if command -v rpmbuild >/dev/null; then
  RPMROOT=$TARGET/rpmbuild
  rm -rf "$RPMROOT"; mkdir -p "$RPMROOT"/{SPECS,RPMS,BUILD,BUILDROOT,SOURCES,SRPMS}
  STAGE=$TARGET/pkgroot-rpm
  stage "$STAGE" "$RPM_PLUGDIR"
  stage_debug "$STAGE-debug" "$RPM_PLUGDIR"   # both packages come from one build root
  cp -a "$STAGE-debug/." "$STAGE/"
  cat > "$RPMROOT/SPECS/spank-gpu.spec" <<SPEC
Name: spank-gpu
Version: $VERSION
Release: 1.slurm$SLURM
Summary: GPU jobs on Slurm, right the first time
License: MIT OR Apache-2.0
Requires: slurm >= $SLURM, slurm < $NEXT
# rpm finds the shared libraries the programs need (hwloc's, udev's, glibc's);
# the plugin's Slurm symbols come from the process that loads it.
AutoReq: yes
AutoProv: no
# udev's library comes through hwloc's (the .deb names both too).
Requires: libudev.so.1()(64bit)
%{?systemd_requires}
# Where systemd's rpm macros are missing (this build host), the same steps.
%if 0%{!?systemd_post:1}
%define systemd_post() if [ \$1 -eq 1 ] && [ -x /usr/bin/systemctl ]; then /usr/bin/systemctl --no-reload preset %{?*} >/dev/null 2>&1 || :; fi
%define systemd_preun() if [ \$1 -eq 0 ] && [ -x /usr/bin/systemctl ]; then /usr/bin/systemctl --no-reload disable --now %{?*} >/dev/null 2>&1 || :; fi
%define systemd_postun_with_restart() if [ -x /usr/bin/systemctl ]; then /usr/bin/systemctl daemon-reload >/dev/null 2>&1 || :; if [ \$1 -ge 1 ]; then /usr/bin/systemctl try-restart %{?*} >/dev/null 2>&1 || :; fi; fi
%endif
%description
spank_gpu.so (--auto-rdzv, --gpu-affinity) and gpu-node-agent, built for Slurm $SLURM.
%package debuginfo
Summary: Debug info for spank-gpu
Requires: spank-gpu = %{version}-%{release}
AutoReq: no
%description debuginfo
The debug info split off spank_gpu.so, gpu-node-agent and spank-gpu.
%pre
$(release_check refuse)
%post
$(release_check warn)
$(plugstack_note)
%systemd_post $UNIT
%preun
%systemd_preun $UNIT
%postun
%systemd_postun_with_restart $UNIT
%install
cp -a $STAGE/. %{buildroot}/
%files debuginfo
/usr/lib/debug$RPM_PLUGDIR/spank_gpu.so.debug
/usr/lib/debug/usr/sbin/gpu-node-agent.debug
/usr/lib/debug/usr/bin/spank-gpu.debug
%files
$RPM_PLUGDIR/spank_gpu.so
/usr/sbin/gpu-node-agent
/usr/bin/spank-gpu
%config(noreplace) /etc/slurm/plugstack.conf.d/spank-gpu.conf
%config(noreplace) /etc/gpu-node-agent/config.toml
/lib/systemd/system/gpu-node-agent.service
/usr/share/man/man8/gpu-node-agent.8.gz
/usr/share/man/man1/spank-gpu.1.gz
/usr/share/spank-gpu
/usr/libexec/spank-gpu
%doc /usr/share/doc/spank-gpu
SPEC
  rpmbuild --quiet --define "_topdir $RPMROOT" --define "_build_id_links none" \
    --define "__os_install_post %{nil}" --target "$(uname -m)" -bb "$RPMROOT/SPECS/spank-gpu.spec"
  for f in "$RPMROOT"/RPMS/*/*.rpm; do
    cp "$f" "$OUT/"
    case "$(basename "$f")" in
      spank-gpu-debuginfo-*) DEBUGINFO_RPM=$OUT/$(basename "$f") ;;
      *) RPM=$OUT/$(basename "$f") ;;
    esac
    echo "built $OUT/$(basename "$f")"
  done
else
  echo "packaging/build.sh: rpmbuild not found (apt-get install rpm); no .rpm built" >&2
fi

# ---------- what was built, for packaging/test-install.sh ----------
cat > "$OUT/slurm$SLURM.files" <<FILES
SLURM=$SLURM
DEB=$DEB
DBG_DEB=$DBG_DEB
RPM=$RPM
DEBUGINFO_RPM=$DEBUGINFO_RPM
DEB_PLUGDIR=$DEB_PLUGDIR
PROM_RULES=$PROM_RULES
FILES
echo "listed in $OUT/slurm$SLURM.files"
