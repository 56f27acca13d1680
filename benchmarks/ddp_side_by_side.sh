#!/usr/bin/env bash
# The ResNet example trained by dtrain's C++ trainer and by PyTorch in Python on the same libtorch,
# single-process and on 2 ranks (dtrain over MPI; torch.distributed DDP over gloo), interleaved
# round by round in one run. Same networks (layers, widths, stem, initialization), same synthetic
# data shape, same per-rank batch, the same intra-op threads per rank, SGD with momentum.
#
#   cmake -S . -B build-bench -DCMAKE_BUILD_TYPE=Release -DDTRAIN_MPI=mpich \
#         -DCMAKE_PREFIX_PATH="$(tools/setup-libtorch.sh)"
#   cmake --build build-bench --target resnet_train -j2
#   benchmarks/ddp_side_by_side.sh build-bench | tee ddp.log
#
# Environment: PYTHON (default .venv/bin/python, the environment tools/setup-libtorch.sh makes, so
# both sides load the same libtorch), MPIEXEC (default mpiexec.mpich), ROUNDS (default 3),
# CONFIGS (default "resnet20:32:64 resnet18:64:32", model:image px:batch per rank), STEPS (steps
# per epoch, default 8), EPOCHS (default 3; the first is warm-up and not counted), THREADS (per
# rank, default 1: 2 ranks x 1 thread fill 2 cores), BUCKETS (default empty: --bucket-mb values to
# run as further dtrain 2-rank variants next to the trainer's default, e.g. "0 25").
#
# Every run prints one RESULT line: its median step time over the measured epochs, and its best
# epoch's. The table at the end has, over the rounds, the median of the former and the minimum of
# the latter: on a machine shared with other work the minimum is the least disturbed measurement,
# and both are reported. Scaling efficiency is the 2-rank images/s over twice the single-process
# images/s with the same threads per rank (1.00: the second rank adds its full share), from medians
# and from minima.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=${1:-build}
trainer="$build_dir/examples/resnet/resnet_train"
python=${PYTHON:-$root/.venv/bin/python}
mpiexec=${MPIEXEC:-mpiexec.mpich}
rounds=${ROUNDS:-3}
configs=${CONFIGS:-"resnet20:32:64 resnet18:64:32"}
steps=${STEPS:-8}
epochs=${EPOCHS:-3}
threads=${THREADS:-1}
buckets=${BUCKETS:-}

if [[ ! -x $trainer ]]; then
  echo "error: $trainer is missing; build the resnet_train target of $build_dir first" >&2
  exit 1
fi
if ! "$python" -c 'import torch' 2>/dev/null; then
  echo "error: $python cannot import torch; run tools/setup-libtorch.sh or set PYTHON" >&2
  exit 1
fi
# The trainer must load the libtorch that Python imports: a like-for-like comparison.
py_lib=$("$python" -c 'import os, torch; print(os.path.realpath(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")))')
cpp_lib=$(ldd "$trainer" | awk '$1 == "libtorch_cpu.so" { print $3 }')
cpp_lib=$(realpath "$cpp_lib")
if [[ $py_lib != "$cpp_lib" ]]; then
  echo "error: $trainer loads $cpp_lib but $python imports $py_lib" >&2
  exit 1
fi

echo "# $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) CPUs,$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
echo "# libtorch: $cpp_lib ($("$python" -c 'import torch; print(torch.__version__)'))"
echo "# $rounds rounds, $epochs epochs of $steps steps per run (first epoch not counted), $threads threads per rank"
echo "# load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"

# One run of the C++ trainer; prints its RESULT line in the Python script's format.
# A fifth argument runs the trainer with --bucket-mb of that value.
run_cpp() {
  local ranks=$1 model=$2 image=$3 batch=$4 bucket=${5:-} impl
  local samples=$((ranks * steps * batch))
  local extra=()
  impl=$([[ $ranks == 1 ]] && echo cpp || echo dtrain)
  if [[ -n $bucket ]]; then
    impl="dtrain_bucket_$bucket"
    extra=(--bucket-mb "$bucket")
  fi
  "$mpiexec" -n "$ranks" "$trainer" --dataset synthetic --synthetic-samples "$samples" \
    --image-size "$image" --model "$model" --batch-size "$batch" --epochs "$epochs" \
    --max-steps-per-epoch "$steps" --eval-samples "$batch" --threads "$threads" --seed 42 \
    "${extra[@]}" |
    tee -a /dev/stderr |
    awk '/^epoch / { n++; for (i = 1; i <= NF; ++i) if ($i == "img/s" && n > 1) print $(i - 1) }' |
    sort -g |
    awk -v impl="$impl" -v ranks="$ranks" -v model="$model" -v image="$image" -v batch="$batch" \
      -v threads="$threads" '
      { rates[++m] = $1 }
      END {
        if (m == 0) exit 1
        med = (m % 2) ? rates[(m + 1) / 2] : (rates[m / 2] + rates[m / 2 + 1]) / 2
        printf "RESULT impl=%s ranks=%d model=%s image=%d batch=%d threads=%d step_ms=%.1f best_ms=%.1f img_s=%.1f epochs=%d\n",
          impl, ranks, model, image, batch, threads, 1000 * ranks * batch / med,
          1000 * ranks * batch / rates[m], med, m
      }'
}

run_py() {
  local ranks=$1 model=$2 image=$3 batch=$4
  "$python" "$root/benchmarks/ddp_resnet.py" --ranks "$ranks" --model "$model" \
    --image-size "$image" --batch-size "$batch" --epochs "$epochs" --steps "$steps" \
    --samples $((ranks * steps * batch)) --threads "$threads" --seed 42 2>&1 |
    tee -a /dev/stderr | grep '^RESULT '
}

results=$(mktemp)
trap 'rm -f "$results"' EXIT
variants=("py 1" "cpp 1" "py 2" "cpp 2")
for mb in $buckets; do variants+=("cpp 2 $mb"); done
for ((r = 0; r < rounds; ++r)); do
  for config in $configs; do
    IFS=: read -r model image batch <<<"$config"
    # The order rotates every round, so no variant always runs first (or after the same one).
    for ((v = 0; v < ${#variants[@]}; ++v)); do
      read -r side ranks bucket <<<"${variants[(v + r) % ${#variants[@]}]}"
      echo "## round $((r + 1)): $side, $ranks ranks, $model ${image}px batch $batch" \
        "${bucket:+--bucket-mb $bucket}" >&2
      line=$("run_$side" "$ranks" "$model" "$image" "$batch" $bucket) || {
        echo "error: the $side run with $ranks ranks of $model printed no result" >&2
        exit 1
      }
      echo "$line"
      echo "$line" >>"$results"
    done
  done
done
echo "# load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
echo

"$python" - "$results" <<'EOF'
import collections, statistics, sys

median_ms = collections.defaultdict(list)
best_ms = collections.defaultdict(list)
for line in open(sys.argv[1]):
    fields = dict(f.split("=", 1) for f in line.split()[1:])
    key = (fields["model"], fields["image"], fields["batch"], fields["impl"], int(fields["ranks"]))
    median_ms[key].append(float(fields["step_ms"]))
    best_ms[key].append(float(fields["best_ms"]))

names = {"python": "PyTorch (Python), 1 process", "cpp": "dtrain C++ trainer, 1 process",
         "ddp": "PyTorch DDP (gloo), 2 ranks", "dtrain": "dtrain C++ trainer, 2 ranks"}
models = sorted({k[:3] for k in median_ms}, key=lambda k: (k[0] != "resnet20", k[0]))
for model, image, batch in models:
    print(f"**{model}, {image}x{image} px, batch {batch} per rank**\n")
    print("| trainer | step (median) | step (min) | images/s (median) | images/s (min step) "
          "| scaling efficiency (median / min) | runs |")
    print("|---|---|---|---|---|---|---|")
    med, low = {}, {}
    bucket_impls = sorted({k[3] for k in median_ms if k[:3] == (model, image, batch)
                           and k[3].startswith("dtrain_bucket_")},
                          key=lambda impl: float(impl.rsplit("_", 1)[1]))
    for impl in ["python", "cpp", "ddp", "dtrain"] + bucket_impls:
        ranks = 1 if impl in ("python", "cpp") else 2
        key = (model, image, batch, impl, ranks)
        if key not in median_ms:
            continue
        med[impl] = statistics.median(median_ms[key])
        low[impl] = min(best_ms[key])
        if impl.startswith("dtrain_bucket_"):
            names[impl] = f"dtrain C++ trainer, 2 ranks, --bucket-mb {impl.rsplit('_', 1)[1]}"
        single = "python" if impl == "ddp" else "cpp" if impl.startswith("dtrain") else None
        eff = f"{med[single] / med[impl]:.2f} / {low[single] / low[impl]:.2f}" if single in med else ""
        print(f"| {names[impl]} | {med[impl]:.1f} ms | {low[impl]:.1f} ms "
              f"| {ranks * int(batch) * 1000 / med[impl]:.1f} | {ranks * int(batch) * 1000 / low[impl]:.1f} "
              f"| {eff} | {len(median_ms[key])} |")
    print()
    if "cpp" in med and "python" in med:
        print(f"- C++ / Python single-process step: {med['cpp'] / med['python']:.2f} (medians), "
              f"{low['cpp'] / low['python']:.2f} (minima); target <= 1.10")
    if "dtrain" in med and "ddp" in med:
        print(f"- dtrain / DDP 2-rank step: {med['dtrain'] / med['ddp']:.2f} (medians), "
              f"{low['dtrain'] / low['ddp']:.2f} (minima); target <= 1.00")
    for impl in bucket_impls:
        if impl in med and "ddp" in med:
            print(f"- {names[impl].split(', ')[-1]}: dtrain / DDP 2-rank step "
                  f"{med[impl] / med['ddp']:.2f} (medians), {low[impl] / low['ddp']:.2f} (minima)")
    print()
EOF
