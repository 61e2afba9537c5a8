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

# ---------- the file tree, shared by both formats ----------
stage() { # stage ROOT PLUGIN_DIR
  local root=$1 plugdir=$2
  rm -rf "$root"
  install -D -m 0644 target/release/libspank_gpu.so "$root$plugdir/spank_gpu.so"
  install -D -m 0755 target/release/gpu-node-agent "$root/usr/sbin/gpu-node-agent"
  install -D -m 0755 target/release/spank-gpu "$root/usr/bin/spank-gpu"
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
Depends: slurm-client (>= $SLURM), slurm-client (<< $NEXT~), libc6, libgcc-s1, libhwloc15, libudev1
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
cat > "$ROOT/DEBIAN/postinst" <<'POST'
#!/bin/sh
set -e
if [ -d /run/systemd/system ]; then systemctl daemon-reload || true; fi
POST
cat > "$ROOT/DEBIAN/postrm" <<'POST'
#!/bin/sh
set -e
if [ "$1" = remove ]; then
  # Keep only the configuration the admin edited: an unchanged plugstack
  # snippet would point Slurm at a plugin that is gone.
  dpkg-query -W -f='${Conffiles}\n' spank-gpu 2>/dev/null | while read -r file sum rest; do
    [ -n "$file" ] && [ -f "$file" ] || continue
    if [ "$(md5sum < "$file" | cut -d' ' -f1)" = "$sum" ]; then rm -f "$file"; fi
  done
fi
if [ "$1" = purge ]; then rm -rf /var/lib/gpu-node-agent /etc/gpu-node-agent /etc/slurm/plugstack.conf.d/spank-gpu.conf; fi

if [ -d /run/systemd/system ]; then systemctl daemon-reload || true; fi
POST
chmod 0755 "$ROOT/DEBIAN/preinst" "$ROOT/DEBIAN/postinst" "$ROOT/DEBIAN/postrm"
DEB="$OUT/spank-gpu_${DEB_VERSION}_${ARCH}.deb"
dpkg-deb --root-owner-group -Zxz --build "$ROOT" "$DEB" >/dev/null
echo "built $DEB"

# ---------- .rpm ----------
if command -v rpmbuild >/dev/null; then
  RPMROOT=$(pwd)/target/rpmbuild
  rm -rf "$RPMROOT"; mkdir -p "$RPMROOT"/{SPECS,RPMS,BUILD,BUILDROOT,SOURCES,SRPMS}
  STAGE=$(pwd)/target/pkgroot-rpm
  stage "$STAGE" /usr/lib64/slurm
  cat > "$RPMROOT/SPECS/spank-gpu.spec" <<SPEC
Name: spank-gpu
Version: $VERSION
Release: 1.slurm$SLURM
Summary: GPU jobs on Slurm, right the first time
License: MIT OR Apache-2.0
Requires: slurm >= $SLURM, slurm < $NEXT
AutoReqProv: no
%description
spank_gpu.so (--auto-rdzv, --gpu-affinity) and gpu-node-agent, built for Slurm $SLURM.
%pre
$(version_check)
%install
cp -a $STAGE/. %{buildroot}/
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
  echo "built $(ls "$OUT"/*.rpm)"
else
  echo "packaging/build.sh: rpmbuild not found (apt-get install rpm); no .rpm built" >&2
fi
