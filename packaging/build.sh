#!/usr/bin/env bash
# Builds the spank-gpu packages for the Slurm installed on this machine:
#   packaging/build.sh            -> target/packages/spank-gpu_<ver>-1+slurm<X.Y>_<arch>.deb
#                                    and, when rpmbuild is present, spank-gpu-<ver>-1.slurm<X.Y>.<arch>.rpm
# The plugin only loads into the Slurm major.minor it was built against, so
# build on (a copy of) the machines you install on, once per Slurm release.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
INCLUDE=${SLURM_INCLUDE_DIR:-/usr/include}
NUM=$(sed -n 's/^#define SLURM_VERSION_NUMBER \(0x[0-9a-fA-F]*\).*/\1/p' "$INCLUDE/slurm/slurm_version.h")
if [ -z "$NUM" ]; then
  echo "packaging/build.sh: no SLURM_VERSION_NUMBER in $INCLUDE/slurm/slurm_version.h (install libslurm-dev)" >&2
  exit 1
fi
MAJOR=$(( (NUM >> 16) & 0xff )); MINOR=$(( (NUM >> 8) & 0xff ))
SLURM=$(printf '%d.%02d' "$MAJOR" "$MINOR")
NEXT=$(printf '%d.%02d' "$MAJOR" "$((MINOR + 1))")
ARCH=$(dpkg --print-architecture 2>/dev/null || uname -m)
TRIPLET=$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
OUT=target/packages
mkdir -p "$OUT"

cargo build --release --locked -p spank-gpu -p gpu-node-agent

# ---------- stripped programs, their debug info split off ----------
# Every program ships stripped (the plugin's 6.7 MB with debug info made each
# job step measurably slower to launch); its debug info goes to the -dbgsym
# (.deb) / -debuginfo (.rpm) package, under /usr/lib/debug/<its path>.debug,
# where gdb finds it through the program's .gnu_debuglink (or its build id).
STRIPPED=target/release/stripped
rm -rf "$STRIPPED"; mkdir -p "$STRIPPED"
split_debug() { # split_debug BUILT NAME
  objcopy --only-keep-debug --compress-debug-sections "$1" "$STRIPPED/$2.debug"
  objcopy --strip-all "$1" "$STRIPPED/$2"
  (cd "$STRIPPED" && objcopy --add-gnu-debuglink="$2.debug" "$2")
  chmod 0644 "$STRIPPED/$2.debug"
}
split_debug target/release/libspank_gpu.so spank_gpu.so
split_debug target/release/gpu-node-agent gpu-node-agent
split_debug target/release/spank-gpu spank-gpu

# ---------- the file trees, shared by both formats ----------
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

# The check both formats run before installing: the same Slurm major.minor.
version_check() {
  cat <<CHECK
have=\$(srun --version 2>/dev/null | sed -n 's/^slurm[^ ]* \([0-9]*\)\.\([0-9]*\).*/\1.\2/p')
if [ -n "\$have" ] && [ "\$have" != "$SLURM" ]; then
  echo "spank-gpu: this package was built for Slurm $SLURM, but this machine has Slurm \$have." >&2
  echo "spank-gpu: Slurm loads plugins only into the release they were built for: rebuild spank-gpu against Slurm \$have (packaging/build.sh)." >&2
  exit 1
fi
CHECK
}

# ---------- .deb ----------
DEB_VERSION="$VERSION-1+slurm$SLURM"
ROOT=target/pkgroot-deb
stage "$ROOT" "/usr/lib/$TRIPLET/slurm-wlm"
install -d "$ROOT/DEBIAN"
SIZE=$(du -sk "$ROOT" | cut -f1)
cat > "$ROOT/DEBIAN/control" <<CONTROL
Package: spank-gpu
Version: $DEB_VERSION
Architecture: $ARCH
Maintainer: spank-gpu developers <spank-gpu@localhost>
Installed-Size: $SIZE
Depends: slurm-client (>= $SLURM), slurm-client (<< $NEXT~), libc6, libgcc-s1, libhwloc15, libudev1, init-system-helpers (>= 1.54~)
Recommends: slurmd
Section: admin
Priority: optional
Description: GPU jobs on Slurm, right the first time
 spank_gpu.so, a SPANK plugin: per-task rendezvous, rank and thread
 environment (--auto-rdzv) and GPU-aware CPU binding (--gpu-affinity).
 gpu-node-agent: finds bad GPUs (Xid, ECC, remapped rows) and drains the
 node in Slurm safely. Built for Slurm $SLURM.
CONTROL
printf '/etc/slurm/plugstack.conf.d/spank-gpu.conf\n/etc/gpu-node-agent/config.toml\n' > "$ROOT/DEBIAN/conffiles"
{ echo '#!/bin/sh'; echo 'set -e'; version_check; } > "$ROOT/DEBIAN/preinst"
# The unit is installed, not enabled (roll out in dry-run first, docs/admin.md).
# An upgrade restarts a running agent on the new binary; removal stops and
# disables it; purge forgets it. (What dh_installsystemd --no-enable
# --restart-after-upgrade writes, by hand.)
cat > "$ROOT/DEBIAN/postinst" <<POST
#!/bin/sh
set -e
if [ "\$1" = configure ] || [ "\$1" = abort-upgrade ] || [ "\$1" = abort-deconfigure ] || [ "\$1" = abort-remove ]; then
  deb-systemd-helper unmask $UNIT >/dev/null || true
  deb-systemd-helper update-state $UNIT >/dev/null || true
  if [ -d /run/systemd/system ]; then
    systemctl --system daemon-reload >/dev/null || true
    if [ -n "\$2" ]; then deb-systemd-invoke try-restart $UNIT >/dev/null || true; fi
  fi
fi
POST
cat > "$ROOT/DEBIAN/prerm" <<POST
#!/bin/sh
set -e
if [ "\$1" = remove ] && [ -d /run/systemd/system ]; then
  deb-systemd-invoke stop $UNIT >/dev/null || true
fi
POST
cat > "$ROOT/DEBIAN/postrm" <<POST
#!/bin/sh
set -e
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
chmod 0755 "$ROOT/DEBIAN/preinst" "$ROOT/DEBIAN/postinst" "$ROOT/DEBIAN/prerm" "$ROOT/DEBIAN/postrm"
DEB="$OUT/spank-gpu_${DEB_VERSION}_${ARCH}.deb"
dpkg-deb --root-owner-group -Zxz --build "$ROOT" "$DEB" >/dev/null
echo "built $DEB"

DBG_ROOT=target/pkgroot-deb-dbgsym
stage_debug "$DBG_ROOT" "/usr/lib/$TRIPLET/slurm-wlm"
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
if command -v rpmbuild >/dev/null; then
  RPMROOT=$(pwd)/target/rpmbuild
  rm -rf "$RPMROOT"; mkdir -p "$RPMROOT"/{SPECS,RPMS,BUILD,BUILDROOT,SOURCES,SRPMS}
  STAGE=$(pwd)/target/pkgroot-rpm
  stage "$STAGE" /usr/lib64/slurm
  stage_debug "$STAGE-debug" /usr/lib64/slurm   # both packages come from one build root
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
$(version_check)
%post
%systemd_post $UNIT
%preun
%systemd_preun $UNIT
%postun
%systemd_postun_with_restart $UNIT
%install
cp -a $STAGE/. %{buildroot}/
%files debuginfo
/usr/lib/debug/usr/lib64/slurm/spank_gpu.so.debug
/usr/lib/debug/usr/sbin/gpu-node-agent.debug
/usr/lib/debug/usr/bin/spank-gpu.debug
%files
/usr/lib64/slurm/spank_gpu.so
/usr/sbin/gpu-node-agent
/usr/bin/spank-gpu
%config(noreplace) /etc/slurm/plugstack.conf.d/spank-gpu.conf
%config(noreplace) /etc/gpu-node-agent/config.toml
/lib/systemd/system/gpu-node-agent.service
/usr/share/man/man8/gpu-node-agent.8.gz
/usr/share/man/man1/spank-gpu.1.gz
%doc /usr/share/doc/spank-gpu
SPEC
  rpmbuild --quiet --define "_topdir $RPMROOT" --define "_build_id_links none" \
    --define "__os_install_post %{nil}" --target "$(uname -m)" -bb "$RPMROOT/SPECS/spank-gpu.spec"
  cp "$RPMROOT"/RPMS/*/*.rpm "$OUT/"
  for f in "$OUT"/*.rpm; do echo "built $f"; done
else
  echo "packaging/build.sh: rpmbuild not found (apt-get install rpm); no .rpm built" >&2
fi
