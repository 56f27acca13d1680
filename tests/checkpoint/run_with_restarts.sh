#!/usr/bin/env bash
# Runs a job and starts it again when it fails, up to RESTARTS times, saying why each restart
# happened; exits with the job's last status. The same contract as `dtrainrun --restarts K`.
#   run_with_restarts.sh RESTARTS command...
set -uo pipefail
restarts=$1
shift
attempt=0
while true; do
  "$@"
  rc=$?
  [[ $rc -eq 0 ]] && exit 0
  why="exit code $rc"
  (( rc > 128 )) && why="$why (killed by signal $((rc - 128)))"
  if (( attempt >= restarts )); then
    echo "run_with_restarts: the job failed with $why and all $restarts restarts are used up"
    exit $rc
  fi
  attempt=$((attempt + 1))
  echo "run_with_restarts: the job failed with $why; restart $attempt of $restarts"
done
