#!/usr/bin/env bash
# Runs every dtrain benchmark in one go and prints the markdown tables docs/performance.md quotes.
#
#   cmake -S . -B build-bench -DCMAKE_BUILD_TYPE=Release
#   cmake --build build-bench --target dtrain_benchmarks -j2
#   benchmarks/run_all.sh build-bench | tee bench.log
#
# Environment: MPIEXEC (default mpiexec), RANKS (default "2 4"), ROUNDS (default 10: rounds of the
# bandwidth benchmark; the gradient-sync benchmark runs ROUNDS-2), IDLE_SECONDS (default 10).
# DTRAIN_* variables pass through to every rank (e.g. DTRAIN_MPI_CHUNK_BYTES=8M).
set -euo pipefail

build_dir=${1:-build-bench}
bin="$build_dir/benchmarks"
mpiexec=${MPIEXEC:-mpiexec}
ranks=${RANKS:-"2 4"}
rounds=${ROUNDS:-10}
idle_seconds=${IDLE_SECONDS:-10}

for b in allreduce_bandwidth grad_sync small_op_latency allgather_fusion idle_cpu steady_state_alloc; do
  if [[ ! -x "$bin/bench_$b" ]]; then
    echo "error: $bin/bench_$b is missing; build the dtrain_benchmarks target of $build_dir first" >&2
    exit 1
  fi
done

run() {
  echo "\$ $*"
  "$@"
  echo
}

echo "# $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
echo "# load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
if command -v mpichversion >/dev/null; then
  echo "# MPICH $(mpichversion | grep -m1 'Version:' | awk '{print $NF}'), device $(mpichversion | grep -m1 'Device:' | awk '{print $NF}')"
fi
echo
for n in $ranks; do
  run "$mpiexec" -n "$n" "$bin/bench_allreduce_bandwidth" --rounds="$rounds"
  run "$mpiexec" -n "$n" "$bin/bench_grad_sync" --rounds="$((rounds > 3 ? rounds - 2 : rounds))"
  run "$mpiexec" -n "$n" "$bin/bench_small_op_latency"
  run "$mpiexec" -n "$n" "$bin/bench_allgather_fusion"
done
run "$mpiexec" -n 2 "$bin/bench_idle_cpu" --seconds="$idle_seconds"
run "$mpiexec" -n 2 "$bin/bench_steady_state_alloc"
if [[ -x "$bin/bench_sync_batch_norm" ]]; then  # built where libtorch was found
  run "$mpiexec" -n 2 "$bin/bench_sync_batch_norm"
fi
echo "# load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
