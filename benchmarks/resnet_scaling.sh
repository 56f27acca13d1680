#!/usr/bin/env bash
# Training throughput of the ResNet example (examples/resnet) on 1, 2 and 4 ranks of this machine,
# in one run, as a markdown table: global images/s, step time, and scaling efficiency against the
# single-process trainer doing the same per-rank work.
#
#   cmake -S . -B build -DCMAKE_BUILD_TYPE=Release && cmake --build build --target resnet_train
#   benchmarks/resnet_scaling.sh build | tee scaling.log
#
# Environment: MPIEXEC (default mpiexec), RANKS (default "1 2 4"), MODEL (default resnet20),
# BATCH (per-rank batch, default 64), STEPS (measured steps per run, default 30), IMAGE_SIZE
# (default 32), REPEATS (runs per configuration, interleaved; the best is reported, default 2).
#
# Every configuration trains on synthetic 3-channel images (no data loading in the timing) with
# one rank's threads = cores / ranks (at least 1), the trainer's own default. The "1 rank" rows run
# under the launcher too, so dtrain is initialized but has nobody to talk to: the baseline is the
# same binary, the same per-rank batch and the same threads per rank, without communication.
set -euo pipefail

build_dir=${1:-build}
trainer="$build_dir/examples/resnet/resnet_train"
mpiexec=${MPIEXEC:-mpiexec}
ranks_list=${RANKS:-"1 2 4"}
model=${MODEL:-resnet20}
batch=${BATCH:-64}
steps=${STEPS:-30}
image_size=${IMAGE_SIZE:-32}
repeats=${REPEATS:-2}
cores=$(nproc)

if [[ ! -x $trainer ]]; then
  echo "error: $trainer is missing; build the resnet_train target of $build_dir first" >&2
  exit 1
fi

# Prints the global images/s of one run (the trainer's final line).
images_per_second() {
  local ranks=$1 threads=$2
  local samples=$(((steps + 1) * batch * ranks))
  # Two epochs of `steps` steps: the second excludes warm-up (allocation, first negotiation).
  "$mpiexec" -n "$ranks" "$trainer" --dataset synthetic --image-size "$image_size" \
    --synthetic-samples "$samples" --model "$model" --batch-size "$batch" --epochs 2 \
    --max-steps-per-epoch "$steps" --eval-samples 1 --threads "$threads" --seed 1 |
    awk '/^epoch +2\/2/ { for (i = 1; i <= NF; ++i) if ($i == "img/s") print $(i - 1) }'
}

echo "# $(date -u +%Y-%m-%dT%H:%MZ), $cores CPUs,$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
echo "# $model, synthetic ${image_size}x${image_size}x3, batch $batch per rank, $steps timed steps; best of $repeats interleaved runs"
echo "# load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"

threads_for() { echo $((cores / $1 > 0 ? cores / $1 : 1)); }

# Configurations "ranks:threads": every rank count, and one process at each per-rank thread count
# (the same trainer doing one rank's work alone: the equal-work baseline).
configs=()
for n in $ranks_list; do configs+=("$n:$(threads_for "$n")"); done
for n in $ranks_list; do
  c="1:$(threads_for "$n")"
  [[ " ${configs[*]} " == *" $c "* ]] || configs+=("$c")
done

declare -A best
for ((r = 0; r < repeats; ++r)); do
  for c in "${configs[@]}"; do
    v=$(images_per_second "${c%%:*}" "${c##*:}")
    if [[ -z $v ]]; then
      echo "error: the run with ranks:threads = $c printed no epoch line" >&2
      exit 1
    fi
    if [[ -z ${best[$c]:-} ]] || awk -v a="$v" -v b="${best[$c]}" 'BEGIN { exit !(a > b) }'; then
      best[$c]=$v
    fi
  done
done

first=$(echo "$ranks_list" | awk '{print $1}')
base=${best["$first:$(threads_for "$first")"]}
echo
echo "| ranks | threads / rank | global batch | images/s (all ranks) | step time | images/s vs 1 rank on the same cores | step time vs 1 process, same threads and batch | ideal |"
echo "|---|---|---|---|---|---|---|---|"
for n in $ranks_list; do
  t=$(threads_for "$n")
  awk -v n="$n" -v t="$t" -v b="$batch" -v ips="${best[$n:$t]}" -v base="$base" \
    -v alone="${best[1:$t]}" -v cores="$cores" 'BEGIN {
    step = 1000 * n * b / ips
    step_alone = 1000 * b / alone
    ideal = n * t > cores ? n * t / cores : 1
    printf "| %d | %d | %d | %.1f | %.1f ms | %.2f | %.2f | %.2f |\n", n, t, n * b, ips, step, ips / base, step / step_alone, ideal
  }'
done
echo
echo "# ideal: the step-time ratio when communication were free; above 1 where ranks x threads exceed the cores"
echo "# load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
