#!/usr/bin/env bash
# weft under a real Slurm: tools/slurm_cluster.sh starts munged, slurmctld and
# two slurmd (nodes n1 and n2) on this machine; then
#   1. `weft recipe sbatch auto` over 2 nodes x 2 ranks: sbatch runs
#      `weft train --auto`, which tunes in the allocation (modelling 2 ranks a
#      node, as Slurm placed them), writes recipe.json and trains;
#   2. `weft recipe sbatch` of that recipe: one rank is SIGKILLed mid-run
#      (after a checkpoint), the script requeues its job, and the second
#      launch resumes from the last checkpoint to the same losses, bit for
#      bit, as the first job's uninterrupted training.
#
#   tests/slurm/test_slurm.sh WEFT_BIN SOURCE_DIR
set -euo pipefail
weft=$1
src=$2
work=$(mktemp -d)
cleanup() {
  bash "$src/tools/slurm_cluster.sh" stop "$work/cluster" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  for f in "$work"/*/slurm-*.out; do [ -f "$f" ] && { echo "--- $f"; grep -v '^\[' "$f" | tail -30; }; done
  for f in "$work"/cluster/log/*.log; do [ -f "$f" ] && { echo "--- $f"; tail -5 "$f"; }; done
  exit 1
}

eval "$(bash "$src/tools/slurm_cluster.sh" start "$work/cluster")" || fail "the test cluster did not start"
[ -n "${SLURM_CONF:-}" ] || fail "no SLURM_CONF from tools/slurm_cluster.sh"
# Both nodes are this host: keep Open MPI's ranks off shared memory between
# them (see tools/slurm_cluster.sh). Root may run mpirun here.
export OMPI_MCA_btl=self,tcp OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
sinfo -N

# Waits for job $1 to leave the queue, at most $2 seconds. A requeued job
# waits for its old credential to expire before it starts again (10 s in
# the test cluster).
wait_job() {
  local jid=$1 limit=$2 t=0 state
  while [ $t -lt $((limit * 2)) ]; do
    state=$(squeue -h -j "$jid" -o %T 2>/dev/null || true)
    [ -z "$state" ] && return 0
    sleep 0.5
    t=$((t + 1))
  done
  fail "job $jid still queued after $limit s (state $state)"
}

losses() {
  python3 -c '
import json, sys
for line in open(sys.argv[1]):
    j = json.loads(line)
    if j.get("kind") == "train":
        print(j["step"], repr(j["loss"]))' "$1"
}

common="--steps 300 --threads 1 --ckpt-every 25 --log-every 1 --eval-every 0"

echo "== 1. tune and train over 2 nodes x 2 ranks through sbatch"
"$weft" recipe sbatch auto --nodes 2 --tasks-per-node 2 --out "$work/a" --script "$work/a.sbatch" \
  --train "--model tiny --seq 32 --global-batch 8 $common --tune-top 2 --retune"
jid=$(sbatch --parsable "$work/a.sbatch")
wait_job "$jid" 400
out="$work/a/slurm-$jid.out"
grep -q "weft: finished" "$out" || fail "the tuning job did not finish"
grep -q "tuning tiny on 4 x cpu" "$out" || fail "the job did not tune over 4 ranks"
python3 - "$work/a/recipe.json" <<'EOF' || fail "the recipe does not model the allocation"
import json, sys
c = json.load(open(sys.argv[1]))["cluster"]
assert c["world"] == 4 and c["gpus_per_node"] == 2, c
EOF
[ "$(losses "$work/a/metrics.jsonl" | wc -l)" -eq 300 ] || fail "the tuned run did not train 300 steps"

echo "== refusals: a rank count that is not the recipe's, an auto job without its size"
set +e
msg=$("$weft" recipe sbatch "$work/a/recipe.json" --nodes 3 --out "$work/x" --script "$work/x.sbatch" 2>&1)
code=$?
set -e
[ $code -eq 2 ] || fail "3 nodes for a 4-rank recipe exited $code: $msg"
echo "$msg" | grep -q "is for 4" || fail "the refusal does not name the recipe's 4 ranks: $msg"
[ ! -e "$work/x.sbatch" ] || fail "a refused script was written"
set +e
msg=$("$weft" recipe sbatch auto --out "$work/x" --script "$work/x.sbatch" 2>&1)
code=$?
set -e
[ $code -eq 2 ] && echo "$msg" | grep -q -- "--nodes" || fail "auto without --nodes: exit $code: $msg"

echo "== 2. the recipe again, a rank killed mid-run, requeued, resumed"
"$weft" recipe sbatch "$work/a/recipe.json" --out "$work/b" --script "$work/b.sbatch" --train "$common"
jid=$(sbatch --parsable "$work/b.sbatch")
n=0
for _ in $(seq 3000); do
  n=$(grep -c '"kind": *"train"' "$work/b/metrics.jsonl" 2>/dev/null || true)
  [ "${n:-0}" -ge 60 ] && break
  sleep 0.1
done
[ "${n:-0}" -ge 60 ] || fail "the job never reached step 60"
victim=""
for p in $(pgrep -x weft || true); do
  tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | grep -q -- "--out $work/b" && victim=$p
done
[ -n "$victim" ] || fail "no rank of the second job to kill"
echo "killing rank process $victim at step $n"
kill -9 "$victim"
wait_job "$jid" 400
out="$work/b/slurm-$jid.out"
grep -q "requeueing" "$out" || fail "the failed launch was not requeued"
grep -q "launch 2" "$out" || fail "no second launch"
grep -q "weft: finished" "$out" || fail "the requeued job did not finish"
if ! diff <(losses "$work/a/metrics.jsonl") <(losses "$work/b/metrics.jsonl") >/dev/null; then
  diff <(losses "$work/a/metrics.jsonl") <(losses "$work/b/metrics.jsonl") | head
  fail "the requeued run's losses differ from the uninterrupted run's"
fi
echo "PASS: 300 steps, a rank killed at step $n, requeued and resumed to the same losses"
