#!/usr/bin/env bash
# CPU time per training step of the ResNet example's C++ trainer and of the same loop in PyTorch
# (benchmarks/ddp_resnet.py), single-process, 1 intra-op thread, on the same libtorch. CPU time,
# unlike wall time, does not grow when other work on the machine takes the core away, so this
# compares the two on a busy machine where ddp_side_by_side.sh's step times cannot.
#
#   benchmarks/single_process_cpu_time.sh build-bench | tee cpu.log
#
# Each side runs twice per round, with EPOCHS_SHORT and EPOCHS_LONG epochs of STEPS steps; the
# difference of the two runs' CPU seconds (user + system, /usr/bin/time) over the difference of
# their step counts is the CPU time of one step, without start-up (loading libtorch, importing
# torch, making the data). Environment: PYTHON (default .venv/bin/python), ROUNDS (default 3),
# CONFIGS (default "resnet20:32:64 resnet18:64:32"), STEPS (default 5), EPOCHS_SHORT (default 1),
# EPOCHS_LONG (default 4).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=${1:-build}
trainer="$build_dir/examples/resnet/resnet_train"
python=${PYTHON:-$root/.venv/bin/python}
rounds=${ROUNDS:-3}
configs=${CONFIGS:-"resnet20:32:64 resnet18:64:32"}
steps=${STEPS:-5}
short=${EPOCHS_SHORT:-1}
long=${EPOCHS_LONG:-4}

[[ -x $trainer ]] || { echo "error: build the resnet_train target of $build_dir first" >&2; exit 1; }

# CPU seconds of one command (user + system, its children included).
cpu_seconds() {
  local out
  out=$(mktemp)
  /usr/bin/time -f "%U %S" -o "$out" "$@" >/dev/null 2>&1
  awk '{ print $1 + $2 }' "$out"
  rm -f "$out"
}

run() {  # run SIDE MODEL IMAGE BATCH EPOCHS
  local side=$1 model=$2 image=$3 batch=$4 epochs=$5
  if [[ $side == cpp ]]; then
    cpu_seconds "$trainer" --dataset synthetic --synthetic-samples $((steps * batch)) \
      --image-size "$image" --model "$model" --batch-size "$batch" --epochs "$epochs" \
      --max-steps-per-epoch "$steps" --eval-samples 1 --threads 1 --seed 42 --quiet
  else
    cpu_seconds "$python" -W ignore "$root/benchmarks/ddp_resnet.py" --model "$model" \
      --image-size "$image" --batch-size "$batch" --epochs "$epochs" --steps "$steps" \
      --samples $((steps * batch)) --threads 1 --seed 42
  fi
}

echo "# $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) CPUs; $rounds rounds; CPU ms per step from runs of $short and $long epochs of $steps steps"
echo "# load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
for ((r = 1; r <= rounds; ++r)); do
  for config in $configs; do
    IFS=: read -r model image batch <<<"$config"
    for side in python cpp; do
      a=$(run "$side" "$model" "$image" "$batch" "$short")
      b=$(run "$side" "$model" "$image" "$batch" "$long")
      awk -v s="$side" -v m="$model" -v i="$image" -v bt="$batch" -v a="$a" -v b="$b" \
        -v n=$(((long - short) * steps)) -v r="$r" 'BEGIN {
        printf "CPU round=%d impl=%s model=%s image=%d batch=%d cpu_ms_per_step=%.1f\n", r, s, m, i, bt, 1000 * (b - a) / n }'
    done
  done
done
echo "# load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
