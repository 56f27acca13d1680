#!/usr/bin/env bash
# Sharded optimizer state, sharded gradients and unsharded, side by side (benchmarks/optimizer_shards.cpp):
# Adam over ResNet-50 of the example, on RANKS ranks of this machine, ROUNDS rounds of both
# configurations in turn. Prints each run's JSON line, then the medians and their ratios.
#
#   benchmarks/optimizer_shards.sh build | tee optimizer-shards.log
#
# Environment: RANKS (default 4), ROUNDS (default 3), MODEL (default resnet50), STEPS (default
# 6), BATCH (default 4), IMAGE (default 32), MPIEXEC (default mpiexec.mpich).
set -euo pipefail

build_dir=${1:-build}
bench="$build_dir/benchmarks/bench_optimizer_shards"
[[ -x $bench ]] || { echo "error: build the bench_optimizer_shards target of $build_dir first" >&2; exit 1; }
ranks=${RANKS:-4}
rounds=${ROUNDS:-3}
mpiexec=${MPIEXEC:-mpiexec.mpich}
args=(--model "${MODEL:-resnet50}" --steps "${STEPS:-6}" --warmup 2 --batch-size "${BATCH:-4}"
      --image-size "${IMAGE:-32}" --threads 1)

lines=()
for ((r = 1; r <= rounds; ++r)); do
  for shard in none optimizer gradients; do
    line=$(OMP_NUM_THREADS=1 "$mpiexec" -n "$ranks" "$bench" "${args[@]}" --shard "$shard" | tail -1)
    echo "$line"
    lines+=("$line")
  done
done

summary=$(cat <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in sys.argv[1:] if l.strip()]
modes = ("none", "optimizer", "gradients")
by = {s: [r for r in runs if r["shard"] == s] for s in modes}
keys = ("step_s", "state_bytes_per_rank", "peak_rss_bytes_per_rank", "peak_heap_bytes_per_rank")
med = {s: {k: statistics.median(r[k] for r in rs) for k in keys} for s, rs in by.items()}
first = runs[0]
print("{}, {} ranks, batch {} of {} px, parameters {:.1f} MiB; medians of {} runs each".format(
    first["model"], first["ranks"], first["batch_size"], first["image_size"],
    first["parameter_bytes"] / 2**20, len(by["none"])))
for s in modes:
    m = med[s]
    print("  shard {:9s}: step {:8.1f} ms   optimizer state {:8.1f} MiB/rank   "
          "peak resident {:8.1f} MiB/rank   peak heap in use {:8.1f} MiB/rank".format(
              s, m["step_s"] * 1e3, m["state_bytes_per_rank"] / 2**20,
              m["peak_rss_bytes_per_rank"] / 2**20, m["peak_heap_bytes_per_rank"] / 2**20))
n = med["none"]
for s in modes[1:]:
    o = med[s]
    print("  {} / unsharded: step {:.3f}x, optimizer state {:.3f}x, peak resident {:.3f}x, "
          "peak heap in use {:.3f}x".format(
              s, o["step_s"] / n["step_s"], o["state_bytes_per_rank"] / n["state_bytes_per_rank"],
              o["peak_rss_bytes_per_rank"] / n["peak_rss_bytes_per_rank"],
              o["peak_heap_bytes_per_rank"] / n["peak_heap_bytes_per_rank"]))
PY
)
python3 -c "$summary" "${lines[@]}"
