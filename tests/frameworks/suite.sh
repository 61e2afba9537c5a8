#!/usr/bin/env bash
# The framework suite's cases, run inside a lab shell (`slurm-lab shell < suite.sh`,
# as tests/run frameworks does): each framework's smallest real distributed job
# (a collective proving that every rank agrees on the world size and its rank)
# under each launch pattern of issue 23, without and with --auto-rdzv, on the
# lab's release. One line per case and mode, then a summary.
#
# From the environment: FW_VENV (the release's venv), FW_DIR (this directory),
# FW_REL (the release, for the lines), FW_MODES (default "without with"),
# FW_ONLY (a regex of case names), FW_LIMIT (seconds per job, default 120),
# FW_SECTION (`jobs`, the default, or `topology`: the srun cases for a lab started
# with `slurm-lab shell --topology tree`).
set -u
OUT=$(dirname "$SLURM_CONF")/frameworks
mkdir -p "$OUT"
J=$FW_DIR/jobs
export PATH=$FW_VENV/bin:$PATH PYTHONPATH=$J PYTHONDONTWRITEBYTECODE=1
# Open MPI refuses root without these; the lab's jobs run as root.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MODES=${FW_MODES:-without with}
LIMIT=${FW_LIMIT:-120}
declare -A passed=() failed=()
results=()

say() { printf '%s\n' "$*"; }

# wait_jobs LIMIT JOBID...: waits for the jobs to leave the queue; cancels them past LIMIT s.
wait_jobs() {
  local limit=$1; shift
  local t=0
  while [ -n "$(squeue -h -j "$(IFS=,; echo "$*")" 2>/dev/null)" ]; do
    if [ "$t" -ge "$limit" ]; then
      scancel "$@" 2>/dev/null
      sleep 2
      return 1
    fi
    sleep 1
    t=$((t + 1))
  done
}

# case NAME WANT 'SBATCH OPTIONS' 'BODY' [COPIES] [PATTERN]: runs BODY as a batch job
# (COPIES jobs at once), in each mode; it passes when the outputs hold WANT `ok` lines
# in all, no FAIL line, and PATTERN where given.
case_() {
  local name=$1 want=$2 opts=$3 body=$4 copies=${5:-1} pattern=${6:-}
  [[ -n ${FW_ONLY:-} && ! $name =~ $FW_ONLY ]] && return
  local mode
  for mode in $MODES; do
    local script=$OUT/$name.$mode.sh started=$SECONDS jobs=() i
    {
      echo '#!/bin/bash'
      echo "#SBATCH $opts"
      echo "#SBATCH -t 5 -o $OUT/$name.$mode.%j.out"
      [ "$mode" = with ] && echo '#SBATCH --auto-rdzv'
      echo "$body"
    } > "$script"
    rm -f "$OUT/$name.$mode".*.out
    for ((i = 0; i < copies; i++)); do
      jobs+=("$(sbatch --parsable "$script" 2>>"$OUT/$name.$mode.submit")")
    done
    local timed_out=
    wait_jobs "$LIMIT" "${jobs[@]}" || timed_out=" (cancelled after ${LIMIT} s)"
    judge "$name" "$mode" "$want" "$copies" "$started" "$timed_out" "$pattern"
  done
}

# judge NAME MODE WANT COPIES STARTED TIMED_OUT PATTERN: the case passes when its
# COPIES outputs ($OUT/NAME.MODE.*.out) hold WANT `ok` lines each, no FAIL line,
# and PATTERN where given; records and prints one line.
judge() {
  local name=$1 mode=$2 want=$3 copies=$4 started=$5 timed_out=$6 pattern=$7
  local oks=0 bad= out detail=
  for out in "$OUT/$name.$mode".*.out; do
    [ -f "$out" ] || continue
    local n; n=$(grep -c '^ok ' "$out")
    [ "$n" -eq "$want" ] || bad=1
    grep -q '^FAIL' "$out" && bad=1
    oks=$((oks + n))
  done
  [ "$(ls "$OUT/$name.$mode".*.out 2>/dev/null | wc -l)" -eq "$copies" ] || bad=1
  [ -n "$pattern" ] && ! grep -qh -- "$pattern" "$OUT/$name.$mode".*.out 2>/dev/null && bad=1
  [ -n "$timed_out" ] && bad=1
  if [ -z "$bad" ]; then
    detail=$(grep -h '^ok ' "$OUT/$name.$mode".*.out | head -1)
    passed[$mode]=$(( ${passed[$mode]:-0} + 1 ))
    results+=("PASS  $FW_REL $mode-plugin $name ($((SECONDS - started)) s): $detail")
  else
    detail=$(grep -hE '^FAIL|Error|error|Timeout|refused|TypeError' "$OUT/$name.$mode".*.out 2>/dev/null \
      | grep -v '^ok ' | head -1 | cut -c1-160)
    failed[$mode]=$(( ${failed[$mode]:-0} + 1 ))
    results+=("FAIL  $FW_REL $mode-plugin $name ($((SECONDS - started)) s$timed_out): $oks/$((want * copies)) ok; ${detail:-no ok line}")
  fi
  say "${results[-1]}"
}

# srun_case NAME 'SRUN OPTIONS' 'BODY': `srun OPTIONS bash -c BODY` making its own
# allocation (where 26.05 numbers tasks in topology order), in each mode; it passes
# as case_ does, with one `ok` line. The output names the node of SLURM_PROCID 0.
srun_case() {
  local name=$1 opts=$2 body=$3
  [[ -n ${FW_ONLY:-} && ! $name =~ $FW_ONLY ]] && return
  local mode
  for mode in $MODES; do
    local started=$SECONDS timed_out= rdzv=()
    [ "$mode" = with ] && rdzv=(--auto-rdzv)
    rm -f "$OUT/$name.$mode".*.out
    # shellcheck disable=SC2086 # the options are words
    # -J: a job named `bash` (srun bash -c ...) makes Lightning ignore Slurm (the
    # fabric-job-named-bash case); these cases are about where task 0 is.
    timeout "$LIMIT" srun $opts -J "fw-$name" -t 3 "${rdzv[@]}" bash -c \
      "[ \"\$SLURM_PROCID\" = 0 ] && echo \"task 0 on \$(hostname)\"; $body" \
      > "$OUT/$name.$mode.0.out" 2>&1 || [ $? -ne 124 ] || timed_out=" (stopped after ${LIMIT} s)"
    judge "$name" "$mode" 1 1 "$started" "$timed_out" ""
    say "      $(grep -h -m1 '^task 0 on' "$OUT/$name.$mode.0.out" || echo 'task 0: no line')"
  done
}

if [ "${FW_SECTION:-jobs}" = topology ]; then
  # On a lab whose first switch holds node2 (slurm-lab shell --topology tree): 26.05
  # puts Slurm's task 0 on node2, earlier releases on node1. JAX and Lightning make
  # SLURM_PROCID 0 their process 0; the plugin must put MASTER_ADDR there.
  srun_case topo-torch-srun "-N2 --ntasks-per-node=2" "EXPECT_WORLD=4 exec python $J/torch_gloo.py"
  srun_case topo-torchrun "-N2 --ntasks-per-node=1 --gpus-per-node=2" "EXPECT_WORLD=4 exec torchrun $J/torch_gloo.py"
  srun_case topo-fabric "-N2 --ntasks-per-node=2" "EXPECT_WORLD=4 DEVICES=2 NODES=2 exec python $J/fabric.py"
  srun_case topo-jax "-N2 --ntasks-per-node=2" "EXPECT_WORLD=4 exec python $J/jax_init.py"
  for mode in $MODES; do
    say "summary $FW_REL topology $mode the plugin: ${passed[$mode]:-0} passed, ${failed[$mode]:-0} failed"
  done
  [ "${failed[with]:-0}" -eq 0 ]
  exit
fi

# A collective over 4 ranks on 2 nodes, 2 per node, with a bare init_process_group.
case_ torch-srun 1 "-N2 --ntasks-per-node=2" "EXPECT_WORLD=4 srun python $J/torch_gloo.py"
# torchrun with no flags: one task per node, 2 GPUs each (PET_NPROC_PER_NODE=2).
case_ torchrun 1 "-N2 --ntasks-per-node=1 --gpus-per-node=2" "EXPECT_WORLD=4 srun torchrun $J/torch_gloo.py"
# The same with no GPUs (one process per node) and with a node's 8 (8 processes each).
case_ torchrun-no-gpus 1 "-N2 --ntasks-per-node=1" "EXPECT_WORLD=2 srun torchrun $J/torch_gloo.py"
case_ torchrun-8-gpus 1 "-N2 --ntasks-per-node=1 --gpus-per-node=8" "EXPECT_WORLD=16 srun torchrun $J/torch_gloo.py"
case_ torchrun-c10d 1 "-N2 --ntasks-per-node=1 --gpus-per-node=2" \
  "EXPECT_WORLD=4 srun torchrun --rdzv-backend=c10d $J/torch_gloo.py"
# The user's --master-port wins over the plugin's endpoint.
case_ torchrun-user-port 1 "-N2 --ntasks-per-node=1 --gpus-per-node=2" \
  "EXPECT_WORLD=4 srun torchrun --master-port 29577 $J/torch_gloo.py" 1 ':29577)'
# Four steps of one job, the last two at once (distinct ports).
case_ four-steps 4 "-N2 --ntasks-per-node=2" "export EXPECT_WORLD=2
srun -N2 -n2 python $J/torch_gloo.py
srun -N2 -n2 python $J/torch_gloo.py
srun -N2 -n2 --overlap python $J/torch_gloo.py &
srun -N2 -n2 --overlap python $J/torch_gloo.py &
wait"
# Two jobs at once on the same nodes.
case_ two-jobs 1 "-N2 --ntasks-per-node=1" "EXPECT_WORLD=2 srun python $J/torch_gloo.py" 2
case_ fabric 1 "-N2 --ntasks-per-node=2" "EXPECT_WORLD=4 DEVICES=2 NODES=2 srun python $J/fabric.py"
# A job named bash: Lightning stops trusting Slurm.
case_ fabric-job-named-bash 1 "-N2 --ntasks-per-node=2 -J bash" \
  "EXPECT_WORLD=4 DEVICES=2 NODES=2 srun python $J/fabric.py"
# accelerate launch, one per node, 2 processes each (its --num_processes is per machine here).
case_ accelerate-launch 1 "-N2 --ntasks-per-node=1" \
  "EXPECT_WORLD=4 srun accelerate launch --multi_gpu --num_processes 2 $J/accel.py"
# accelerate launch over machines reads none of it from the environment: the one line
# docs/users.md gives (single quotes: each node's own NODE_RANK).
case_ accelerate-num-machines 1 "-N2 --ntasks-per-node=1" \
  "EXPECT_WORLD=4 srun bash -c 'accelerate launch --multi_gpu --num_machines 2 --num_processes 4 --machine_rank \$NODE_RANK --main_process_ip \$MASTER_ADDR --main_process_port \$MASTER_PORT $J/accel.py'"
case_ accelerator-srun 1 "-N2 --ntasks-per-node=2" "EXPECT_WORLD=4 srun python $J/accel.py"
case_ deepspeed 1 "-N2 --ntasks-per-node=2" "EXPECT_WORLD=4 srun python $J/ds.py"
case_ jax 1 "-N2 --ntasks-per-node=2" "EXPECT_WORLD=4 srun python $J/jax_init.py"
# Two concurrent JAX steps of one job (JAX alone derives one port per job).
case_ jax-two-steps 2 "-N2 --ntasks-per-node=2" "export EXPECT_WORLD=2
srun -N2 -n2 --overlap python $J/jax_init.py &
srun -N2 -n2 --overlap python $J/jax_init.py &
wait"
# NCCL and gloo on the fabric the admin names (issue 30): nccl_socket_net= on the
# plugstack line (for this case only). The management eth0 comes first on the lab's
# nodes, so NCCL's own rule and gloo's hostname both take it; with the key each node's
# tasks get their own fabric interface (ens1f0np0, enp65s0f1) and every gloo
# connection runs over it. With the plugin only: without it nothing names the fabric.
stack=$(dirname "$SLURM_CONF")/plugstack.conf
cp "$stack" "$OUT/plugstack.conf.orig"
trap 'cp "$OUT/plugstack.conf.orig" "$stack"' EXIT INT TERM
sed -i '/spank_gpu/ s|$| nccl_socket_net=10.78.0.0/24|' "$stack"
MODES=with case_ gloo-fabric 1 "-N2 --ntasks-per-node=2" \
  "EXPECT_WORLD=4 EXPECT_NET=10.78.0.0/24 srun python $J/torch_gloo_fabric.py" 1 'gloo over'
cp "$OUT/plugstack.conf.orig" "$stack"
trap - EXIT INT TERM
[[ -z ${FW_ONLY:-} || gloo-fabric =~ $FW_ONLY ]] && say "      $(grep -h -m1 '^gloo over' "$OUT"/gloo-fabric.with.*.out 2>/dev/null)"
# MPI: mpirun inside the allocation (it starts its daemons with srun), and
# srun --mpi=pmix where this release's Slurm has it; MPI's ranks, never a daemon's RANK.
mpi_check='awk -v want="$1" '"'"'{split($0, f, " "); r[f[2]] = 1; s = s f[4] " "; if ($0 !~ want) bad = bad $0 "; "}
  END {n = 0; for (k in r) n++; ok = (n == 4 && r[0] && r[1] && r[2] && r[3] && s == "4 4 4 4 " && bad == "");
       if (ok) print "ok mpi: 4 ranks 0-3 as MPI numbered them, " want; else print "FAIL mpi: " n " ranks, sizes " s bad}'"'"
case_ mpirun 1 "-N2 --ntasks-per-node=2" "set -- 'RANK=unset'
mpirun -np 4 $J/mpi_ranks.sh > $OUT/mpirun.\$SLURM_JOB_ID.ranks
$mpi_check $OUT/mpirun.\$SLURM_JOB_ID.ranks"
if srun --mpi=list 2>&1 | grep -q pmix; then
  case_ srun-mpi-pmix 1 "-N2 --ntasks-per-node=2" "srun --mpi=pmix $J/mpi_ranks.sh > $OUT/pmix.\$SLURM_JOB_ID.ranks
awk '{r = \$2; if (\$0 !~ \"RANK=(unset|\" r \") \") bad = 1} END {exit bad}' $OUT/pmix.\$SLURM_JOB_ID.ranks || echo FAIL: RANK is not PMIx rank
set -- 'RANK='
$mpi_check $OUT/pmix.\$SLURM_JOB_ID.ranks"
else
  say "SKIP  $FW_REL srun-mpi-pmix: this release's Slurm has no mpi/pmix plugin (srun --mpi=list)"
fi

say ""
say "versions: $(python -c 'import importlib.metadata as m
print(", ".join(f"{p} {m.version(p)}" for p in ("torch", "lightning-fabric", "accelerate", "deepspeed", "jax", "jaxlib")))' 2>&1) python $(python -c 'import platform; print(platform.python_version())'); $(mpirun --version 2>&1 | head -1); $(sinfo --version)"
total=0
for mode in $MODES; do
  say "summary $FW_REL $mode the plugin: ${passed[$mode]:-0} passed, ${failed[$mode]:-0} failed"
done
# The suite fails when a case fails with the plugin.
[ "${failed[with]:-0}" -eq 0 ]
