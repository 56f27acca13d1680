#!/usr/bin/env bash
# Atomicity: a writer killed with SIGKILL in the middle of a checkpoint leaves the previous
# checkpoint valid and nothing that passes for a newer one.
#   atomic_kill.sh "<mpiexec> -n" VICTIM WORKDIR
set -uo pipefail
launcher=$1 victim=$2 work=$3

for attempt in 1 2 3; do
  rm -rf "$work" && mkdir -p "$work"
  $launcher 1 "$victim" write "$work"
  rc=$?
  [[ $rc -ne 3 ]] && break
  echo "attempt $attempt: the write outran the kill; trying again"
done
if [[ $rc -eq 0 || $rc -eq 3 ]]; then
  echo "FAIL: the writer was not killed (exit $rc)"
  exit 1
fi
ls -la "$work"
if ! compgen -G "$work/.checkpoint-000000000002.dtrain.tmp-*" > /dev/null; then
  echo "FAIL: no partly written temporary file: the kill did not land inside the write"
  exit 1
fi
if [[ -e "$work/checkpoint-000000000002.dtrain" ]]; then
  echo "FAIL: the interrupted checkpoint appeared under its final name"
  exit 1
fi
$launcher 1 "$victim" verify "$work" || { echo "FAIL: the previous checkpoint did not survive"; exit 1; }
echo "PASS: the killed write left checkpoint 1 valid and was cleaned up"
