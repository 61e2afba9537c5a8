#!/bin/sh
# The agent's Xid history at long uptimes (issue 25, point 3), old build
# against new in one run: `check --act` over a kernel log of N Xid lines
# (default 100,000: a crash-looping job's ignored Xids 13/31/43 on 8 GPUs,
# and every 1000th a warn-class Xid 94), twice: the first run takes the
# whole log in, the second is a restart that replays it against the saved
# state. A third run reads no kernel log: one pass over the saved state, as
# the daemon's passes are. Prints each run's wall time and state.json's
# size, and old/new.
#
#   node-agent/bench/xid-history.sh OLD NEW [LINES]
#
# OLD and NEW are gpu-node-agent binaries, or git revisions to build (in a
# temporary copy, `cargo build --release`). The fake NVML comes from
# target/release or target/debug (`cargo build -p fake-nvml` first).
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
lines=${3:-100000}
work=$(mktemp -d /tmp/xid-history.XXXXXX)
trap 'rm -rf "$work"' EXIT

binary() { # a path, or a revision to build
    if [ -x "$1" ]; then echo "$1"; return; fi
    src="$work/src-$2"
    mkdir -p "$src"
    git -C "$root" archive "$1" | tar -x -C "$src"
    (cd "$src" && cargo build --release -q -p gpu-node-agent) >&2
    echo "$src/target/release/gpu-node-agent"
}
old=$(binary "$1" old)
new=$(binary "$2" new)
lib=$root/target/release/libfake_nvml.so
[ -f "$lib" ] || lib=$root/target/debug/libfake_nvml.so
[ -f "$lib" ] || { echo "no libfake_nvml.so: cargo build -p fake-nvml" >&2; exit 2; }

# The kernel log: GPUs on buses 1b 43 52 61 9d c3 d1 df (the fake NVML's h100x8).
awk -v n="$lines" 'BEGIN {
    split("1b 43 52 61 9d c3 d1 df", bus, " "); split("13 31 43", ign, " ")
    for (i = 0; i < n; i++) {
        b = bus[i % 8 + 1]; us = 1000000 + i * 1000
        if (i % 1000 == 999) printf "4,%d,%d,-;NVRM: Xid (PCI:0000:%s:00): 94, pid=7, name=python, Contained: CE User Channel (0x9)\n", i, us, b
        else printf "4,%d,%d,-;NVRM: Xid (PCI:0000:%s:00): %s, pid=7, name=python, Ch 00000008\n", i, us, b, ign[i % 3 + 1]
    }
}' > "$work/kmsg"

cat > "$work/scontrol" <<'SC'
#!/bin/sh
case "$1 $2" in
  "show node") printf 'NodeName=%s Arch=x86_64\n   Gres=gpu:h100:8\n   State=IDLE\n' "$3" ;;
esac
SC
chmod 755 "$work/scontrol"
echo b1 > "$work/boot_id"

now() { date +%s.%N; }
measure() { # NAME BINARY
    d=$work/$1; mkdir -p "$d"
    cat > "$d/config.toml" <<CFG
node_name = "n1"
nvml_library = "$lib"
kmsg_path = "$work/kmsg"
state_dir = "$d/state"
scontrol = "$work/scontrol"
boot_id_path = "$work/boot_id"
max_drained_fraction = 1.0
CFG
    for run in 1 2 3; do
        [ "$run" = 3 ] && sed -i 's|^kmsg_path = .*|kmsg_path = ""|' "$d/config.toml"
        t0=$(now)
        FAKE_NVML_STATE=$root/tests/fake-nvml/states/h100x8-healthy.json RUST_LOG=error \
            "$2" --config "$d/config.toml" check --act > "$d/out.$run" 2>&1 || true
        t1=$(now)
        grep -q "^n1: healthy" "$d/out.$run" || { echo "$1, run $run, did not pass:" >&2; tail -5 "$d/out.$run" >&2; }
        size=$(stat -c %s "$d/state/state.json")
        echo "$1 $run $(echo "$t1 $t0" | awk '{ printf "%.3f", $1 - $2 }') $size"
    done
}
{ measure old "$old"; measure new "$new"; } > "$work/results"
printf '%s Xid lines in the kernel log (%s)\n' "$lines" "$(uname -m), $(nproc) CPUs"
printf '%-34s %12s %12s %10s\n' "" "old" "new" "old/new"
awk '
    { t[$1, $2] = $3; s[$1, $2] = $4 }
    END {
        split("first run (takes the log in)|second run (restart, replays it)|one pass over the saved state", what, "|")
        for (r = 1; r <= 3; r++)
            printf "%-34s %11.3fs %11.3fs %10.0f\n", what[r], t["old", r], t["new", r], t["old", r] / t["new", r]
        printf "%-34s %11.0fB %11.0fB %10.0f\n", "state.json after the second run", s["old", 2], s["new", 2], s["old", 2] / s["new", 2]
    }' "$work/results"
