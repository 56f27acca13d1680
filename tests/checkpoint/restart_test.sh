#!/usr/bin/env bash
# The plain trainer killed mid-epoch (SIGKILL of one rank) and started again.
#
#   restart_test.sh MODE "<mpiexec> [flags] -n" TRAINER WORKDIR RANKS CRASH_RANK CRASH_STEP \
#                   RESUME_STEP [RESUME_RANKS FINAL_STEP|EXPECTED_TEXT] -- trainer arguments
#
# bitwise  An uninterrupted run and a run that is killed after CRASH_STEP and restarted (the same
#          command again, until it succeeds) must end with bitwise-equal weights and final
#          checkpoints; the restart must have resumed from checkpoint RESUME_STEP.
# reshard  Killed on RANKS ranks, resumed on RESUME_RANKS: must resume from RESUME_STEP, say it
#          re-sharded, and end after FINAL_STEP steps.
# refuse   Killed on RANKS ranks, resumed on RESUME_RANKS: must fail, saying EXPECTED_TEXT.
#
# Environment: FINAL_LINE, the pattern of the trainer's line that states its final weights
# (default ^final:); COMPARE_CHECKPOINTS=0 skips comparing the final checkpoint files byte for
# byte (a libtorch optimizer's saved state names parameters by their address, which differs from
# process to process).
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mode=$1 launcher=$2 trainer=$3 work=$4 ranks=$5 crash_rank=$6 crash_step=$7 resume_step=$8
shift 8
extra=()
while [[ $# -gt 0 && $1 != "--" ]]; do extra+=("$1"); shift; done
shift
args=("$@")
crash=(--crash-rank "$crash_rank" --crash-after-step "$crash_step")
resume_file=$(printf "checkpoint-%012d.dtrain" "$resume_step")

fail() { echo "FAIL: $*"; exit 1; }
run() {  # run LOG ranks command...: runs it, shows and keeps its output, returns its status
  local log=$1 n=$2
  shift 2
  echo "+ $launcher $n $*"
  $launcher "$n" "$@" > "$log" 2>&1
  local rc=$?
  cat "$log"
  return $rc
}
# The job on $1 ranks, started again each time it fails, up to $2 times. This is what
# `dtrainrun -np N --restarts K -- command` does; to use it, replace this function's body.
launch_with_restarts() {
  local n=$1 restarts=$2
  shift 2
  "$here/run_with_restarts.sh" "$restarts" $launcher "$n" "$@"
}

rm -rf "$work" && mkdir -p "$work"
case $mode in
  bitwise)
    run "$work/reference.log" "$ranks" "$trainer" "${args[@]}" --checkpoint-dir "$work/reference" \
      || fail "the uninterrupted run failed"
    echo "+ (with restarts) $launcher $ranks $trainer ${args[*]} --checkpoint-dir $work/restarted --resume ${crash[*]}"
    launch_with_restarts "$ranks" 2 "$trainer" "${args[@]}" --checkpoint-dir "$work/restarted" \
      --resume "${crash[@]}" > "$work/restarted.log" 2>&1
    rc=$?
    cat "$work/restarted.log"
    [[ $rc -eq 0 ]] || fail "the restarted job did not finish (exit $rc)"
    [[ $(grep -c "restart 1 of 2" "$work/restarted.log") -eq 1 ]] \
      || fail "expected exactly one restart: the crash did not happen, or happened again"
    grep -q "resumed from $work/restarted/$resume_file: step $resume_step," "$work/restarted.log" \
      || fail "the restart did not resume from $resume_file"
    final_line=${FINAL_LINE:-^final:}
    want=$(grep "$final_line" "$work/reference.log")
    got=$(grep "$final_line" "$work/restarted.log")
    [[ -n $want && "$want" == "$got" ]] || fail "final weights differ: '$want' uninterrupted, '$got' restarted"
    if [[ ${COMPARE_CHECKPOINTS:-1} == 1 ]]; then
      last=$(cd "$work/reference" && ls checkpoint-*.dtrain | tail -n 1)
      cmp "$work/reference/$last" "$work/restarted/$last" \
        || fail "the final checkpoints $last differ (model, optimizer, sampler or RNG state)"
      echo "PASS: $got in both runs; final checkpoints $last identical"
    else
      echo "PASS: $got in both runs"
    fi
    ;;
  reshard|refuse)
    resume_ranks=${extra[0]} expected=${extra[1]}
    run "$work/killed.log" "$ranks" "$trainer" "${args[@]}" --checkpoint-dir "$work/ckpt" --resume "${crash[@]}" \
      && fail "the run that should have been killed succeeded"
    run "$work/resumed.log" "$resume_ranks" "$trainer" "${args[@]}" --checkpoint-dir "$work/ckpt" --resume
    rc=$?
    if [[ $mode == reshard ]]; then
      [[ $rc -eq 0 ]] || fail "resuming on $resume_ranks ranks failed (exit $rc)"
      grep -q "resumed from $work/ckpt/$resume_file: step $resume_step,.*saved by $ranks ranks, re-sharded over $resume_ranks" \
        "$work/resumed.log" || fail "no re-sharded resume from $resume_file"
      grep -q "^final: step $expected " "$work/resumed.log" || fail "expected to end after step $expected"
      echo "PASS: $ranks -> $resume_ranks ranks resumed from step $resume_step and ended after step $expected"
    else
      [[ $rc -ne 0 ]] || fail "resuming on $resume_ranks ranks should have been refused"
      grep -qF "$expected" "$work/resumed.log" || fail "the refusal does not say: $expected"
      echo "PASS: refused with: $expected"
    fi
    ;;
  *) fail "unknown mode $mode" ;;
esac
