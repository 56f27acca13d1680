#!/usr/bin/env bash
# Builds and runs dtrain's device checks on a machine with one or more NVIDIA GPUs: every gpu_
# test, compute-sanitizer memcheck where it works, and the device benchmarks. Prints a summary and
# writes it, the benchmark results and every log under OUTPUT_DIR. Meant to finish in < 8 minutes.
#
#   tests/gpu/run_device_checks.sh [OUTPUT_DIR]        (default: ./device-checks)
#
# Environment: BUILD_DIR (default build-device), JOBS (default: number of CPUs), TORCH_PYTHON (a
# Python whose torch is CUDA-enabled, for the ResNet trainer's GPU runs; default python3),
# DTRAIN_CHECKS_SKIP_INSTALL=1 to never call apt-get.
# Exit status: 0 when every required step passed, 1 when one failed, 2 when it could not build.
set -u
set -o pipefail

script_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$script_dir/../.." && pwd)
out=${1:-device-checks}
mkdir -p "$out"
out=$(cd "$out" && pwd)
build=${BUILD_DIR:-$repo/build-device}
jobs=${JOBS:-$(nproc 2>/dev/null || echo 4)}
summary="$out/summary.txt"
results="$out/results.txt"
: >"$summary"
: >"$results"
start_all=$(date +%s)
failed=0

say() { echo "$*" | tee -a "$summary"; }
elapsed() { echo $(($(date +%s) - start_all)); }

# step NAME REQUIRED TIMEOUT_S COMMAND...: runs COMMAND with a timeout, logs to OUTPUT_DIR/NAME.log
# and records PASS/FAIL (a required failure fails the run) or INFO for informational steps.
step() {
  local name=$1 required=$2 limit=$3
  shift 3
  local log="$out/$name.log" t0 rc status
  t0=$(date +%s)
  echo ">>> $name: $*" >"$log"
  timeout --kill-after=10 "$limit" "$@" >>"$log" 2>&1
  rc=$?
  if [ $rc -eq 0 ]; then status=PASS
  elif [ "$required" = yes ]; then status=FAIL; failed=1
  else status="INFO(rc=$rc)"; fi
  [ $rc -eq 124 ] && status="$status timeout ${limit}s"
  grep -h '^RESULT ' "$log" | sed "s/^RESULT //" >>"$results" || true
  printf '%-44s %-22s %4ss  %s\n' "$name" "$status" $(($(date +%s) - t0)) "$log" | tee -a "$summary"
  return $rc
}

say "dtrain device checks ($(date -u +%Y-%m-%dT%H:%M:%SZ)) in $repo"

# ---- toolchain ----------------------------------------------------------------------------------
for d in /usr/local/cuda/bin /usr/local/cuda/compute-sanitizer; do
  [ -d "$d" ] && PATH="$PATH:$d"
done
export PATH
missing=()
command -v cmake >/dev/null || missing+=(cmake)
command -v make >/dev/null || missing+=(make)
command -v g++ >/dev/null || missing+=(g++)
command -v mpiexec.mpich >/dev/null || missing+=(mpich)
[ -e /usr/include/x86_64-linux-gnu/mpich/mpi.h ] || [ -e /usr/include/mpich/mpi.h ] || missing+=(libmpich-dev)
[ -e /usr/include/fmt/format.h ] || missing+=(libfmt-dev)
[ -e /usr/include/doctest/doctest.h ] || missing+=(doctest-dev)
[ -e /usr/include/nlohmann/json.hpp ] || missing+=(nlohmann-json3-dev)
if [ ${#missing[@]} -gt 0 ]; then
  say "installing: ${missing[*]}"
  if [ "${DTRAIN_CHECKS_SKIP_INSTALL:-0}" = 1 ]; then
    say "DTRAIN_CHECKS_SKIP_INSTALL=1: not installing; the build will probably fail"
  else
    sudo_cmd=""
    [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null && sudo_cmd="sudo"
    export DEBIAN_FRONTEND=noninteractive
    { $sudo_cmd apt-get update -qq && $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"; } \
      >"$out/apt.log" 2>&1 || say "apt-get failed (see $out/apt.log): install ${missing[*]} by hand"
  fi
fi

if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader >"$out/gpus.txt" 2>&1
  say "GPUs: $(tr '\n' ';' <"$out/gpus.txt")"
else
  say "nvidia-smi not found"
fi
ngpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
ngpus=${ngpus:-0}
say "GPUs visible: $ngpus; CPUs: $jobs"

# ---- build --------------------------------------------------------------------------------------
targets="gpu_copy_plan gpu_hierarchical gpu_nvrtc_kernels gpu_device gpu_staging gpu_nccl_multi
         bench_gpu_pack bench_gpu_allreduce bench_gpu_grad_sync"
cmake_args=(-DCMAKE_BUILD_TYPE=Release -DDTRAIN_WITH_CUDA=ON -DDTRAIN_MPI=mpich
            -DDTRAIN_BUILD_TESTS=ON -DDTRAIN_BUILD_BENCHMARKS=ON -DDTRAIN_BUILD_EXAMPLES=OFF
            -DDTRAIN_INSTALL=OFF)
[ -d /usr/local/cuda ] && cmake_args+=(-DCUDAToolkit_ROOT=/usr/local/cuda)
if ! step configure yes 180 cmake -S "$repo" -B "$build" "${cmake_args[@]}"; then
  # The whole project may need things a bare GPU machine lacks: configure only the device tests.
  build="$build-standalone"
  failed=0
  step configure_standalone yes 180 cmake -S "$repo/tests/gpu" -B "$build" "${cmake_args[@]}" || {
    say "could not configure; see the logs in $out"
    exit 2
  }
fi
# shellcheck disable=SC2086
step build yes 420 cmake --build "$build" -j "$jobs" --target $targets || {
  say "build failed; see $out/build.log"
  exit 2
}
bin_tests="$build/tests/gpu"
[ -x "$bin_tests/gpu_device" ] || bin_tests="$build"
bin_bench="$build/benchmarks/gpu"

# ---- tests --------------------------------------------------------------------------------------
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
step ctest_gpu yes 360 ctest --test-dir "$build" -R '^gpu_' --output-on-failure --timeout 300
grep -h "no CUDA device: skipped" "$out/ctest_gpu.log" >/dev/null &&
  say "WARNING: a GPU test reported 'no CUDA device: skipped' on this machine"

# ---- compute-sanitizer --------------------------------------------------------------------------
sanitizer=$(command -v compute-sanitizer || true)
if [ -n "$sanitizer" ] && [ "$ngpus" -gt 0 ]; then
  san=("$sanitizer" --tool memcheck --error-exitcode 3 --leak-check no)
  # The kernels, compression and wait loop, without NCCL: must be clean.
  step memcheck_kernels yes 180 "${san[@]}" "$bin_tests/gpu_device" \
    -tc='kernels*,compression*,wait loop*'
  # NCCL's own kernels under memcheck are slow and not always supported: informational.
  step memcheck_nccl no 240 "${san[@]}" "$bin_tests/gpu_device" -tc='nccl*'
  step memcheck_staging_np2 no 180 mpiexec.mpich -n 2 "${san[@]}" "$bin_tests/gpu_staging" \
    -tc='staging: every*'
else
  say "compute-sanitizer not found (or no GPU): memcheck skipped"
fi

# ---- benchmarks ---------------------------------------------------------------------------------
step bench_pack no 120 "$bin_bench/bench_gpu_pack" --rounds=30
step bench_allreduce_np1 no 180 mpiexec.mpich -n 1 "$bin_bench/bench_gpu_allreduce" --rounds=20
step bench_grad_sync_np1 no 120 mpiexec.mpich -n 1 "$bin_bench/bench_gpu_grad_sync" --rounds=20
if [ "$ngpus" -gt 1 ]; then
  step "bench_allreduce_np$ngpus" no 180 mpiexec.mpich -n "$ngpus" "$bin_bench/bench_gpu_allreduce" --rounds=20
  step "bench_grad_sync_np$ngpus" no 120 mpiexec.mpich -n "$ngpus" "$bin_bench/bench_gpu_grad_sync" --rounds=20
fi

# ---- ResNet and Mask R-CNN trainers on the GPU (examples/ against the machine's CUDA libtorch) ---
# The trainer's GPU mode: 1 rank on the device (gradients over NCCL), then 2 ranks sharing it
# (NCCL needs one GPU per rank, so dtrain reduces through pinned host staging). Images/s go to the
# results as resnet_gpu_np<N>_img_s.
torch_python=${TORCH_PYTHON:-python3}
torch_prefix=$("$torch_python" -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null || true)
if [ -n "$torch_prefix" ] && [ "$ngpus" -gt 0 ]; then
  build_resnet="$build-resnet"
  resnet_args=(-DCMAKE_BUILD_TYPE=Release -DDTRAIN_WITH_CUDA=ON -DDTRAIN_MPI=mpich
               -DDTRAIN_BUILD_TESTS=OFF -DDTRAIN_BUILD_BENCHMARKS=OFF -DDTRAIN_INSTALL=OFF
               -DDTRAIN_REQUIRE_TORCH=ON "-DCMAKE_PREFIX_PATH=$torch_prefix")
  [ -d /usr/local/cuda ] && resnet_args+=(-DCUDAToolkit_ROOT=/usr/local/cuda)
  if step configure_resnet yes 300 cmake -S "$repo" -B "$build_resnet" "${resnet_args[@]}" &&
     step build_resnet yes 420 cmake --build "$build_resnet" -j "$jobs" --target resnet_train; then
    trainer="$build_resnet/examples/resnet/resnet_train"
    # ResNet-50, standard stem, 64 px synthetic images: 3 epochs of 100 steps (the first warms up).
    resnet_run=(--dataset synthetic --synthetic-samples 8192 --image-size 64 --model resnet50
                --batch-size 64 --epochs 3 --max-steps-per-epoch 100 --eval-samples 256)
    for n in 1 2; do
      step "resnet_gpu_np$n" yes 240 mpiexec.mpich -n "$n" "$trainer" "${resnet_run[@]}"
      grep -q " on cuda:0" "$out/resnet_gpu_np$n.log" ||
        { say "resnet_gpu_np$n: the trainer did not run on the GPU"; failed=1; }
      awk -v n="$n" '/^epoch +3\/3/ { for (i = 1; i <= NF; ++i) if ($i == "img/s")
        print "resnet_gpu_np" n "_img_s " $(i - 1) }' "$out/resnet_gpu_np$n.log" >>"$results"
    done
    # SyncBatchNorm on CUDA tensors (53 layers, 2 ranks sharing the device): it must run and
    # finish; images/s against resnet_gpu_np2_img_s is its cost.
    step resnet_gpu_syncbn_np2 yes 240 mpiexec.mpich -n 2 "$trainer" "${resnet_run[@]}" --sync-bn
    grep -q "53 SyncBatchNorm layers" "$out/resnet_gpu_syncbn_np2.log" ||
      { say "resnet_gpu_syncbn_np2: the trainer did not convert its batch norms"; failed=1; }
    awk '/^epoch +3\/3/ { for (i = 1; i <= NF; ++i) if ($i == "img/s")
      print "resnet_gpu_syncbn_np2_img_s " $(i - 1) }' "$out/resnet_gpu_syncbn_np2.log" >>"$results"
  fi
  # ---- Mask R-CNN trainer on the GPU: the smoke run (40 steps, then the COCO evaluation) at 1 and
  # 2 ranks. It needs nlohmann-json and stb (the example is skipped without them), so a machine
  # missing them reports the build as INFO rather than failing the checks.
  if step build_mask_rcnn no 420 cmake --build "$build_resnet" -j "$jobs" --target mask_rcnn_train; then
    mask_rcnn="$build_resnet/examples/mask_rcnn/mask_rcnn_train"
    for n in 1 2; do
      step "mask_rcnn_gpu_np$n" yes 300 mpiexec.mpich -n "$n" "$mask_rcnn" --smoke --device cuda \
        --out "$out/mask_rcnn_np$n"
      grep -q " on cuda:0" "$out/mask_rcnn_gpu_np$n.log" ||
        { say "mask_rcnn_gpu_np$n: the trainer did not run on the GPU"; failed=1; }
      [ -s "$out/mask_rcnn_np$n/detections.json" ] ||
        { say "mask_rcnn_gpu_np$n: no detections.json"; failed=1; }
    done
    # SyncBatchNorm in the backbone and the mask head, whose regions differ per rank.
    step mask_rcnn_gpu_syncbn_np2 yes 300 mpiexec.mpich -n 2 "$mask_rcnn" --smoke --device cuda \
      --norm syncbn --out "$out/mask_rcnn_syncbn_np2"
    [ -s "$out/mask_rcnn_syncbn_np2/detections.json" ] ||
      { say "mask_rcnn_gpu_syncbn_np2: no detections.json"; failed=1; }
  fi
else
  say "no CUDA libtorch importable by $torch_python (or no GPU): ResNet GPU runs skipped"
fi

# ---- summary ------------------------------------------------------------------------------------
say ""
say "benchmark results (also in $results):"
sed 's/^/  /' "$results" | tee -a "$summary"
target() {  # target KEY_REGEX MIN LABEL
  awk -v re="$1" -v min="$2" -v label="$3" '
    $1 ~ re { n++; if ($2 + 0 < min) { bad++; worst = worst " " $1 "=" $2 } }
    END { if (n == 0) print "  " label ": no result";
          else if (bad) print "  " label ": NOT met by" worst;
          else print "  " label ": met (" n " results)" }' "$results" | tee -a "$summary"
}
say "targets:"
target '^pack_(resnet50|single_256MiB)_vs_memcpy$' 0.8 "pack kernel >= 0.8x cudaMemcpy D2D"
target '^unpack_postscale_.*_vs_memcpy$' 0.8 "unpack kernel >= 0.8x cudaMemcpy D2D"
target '^allreduce_[0-9]+MiB_np[0-9]+_raw_over_dtrain$' 0.95 "dtrain allreduce >= 0.95x raw NCCL (>= 1 MiB)"
say ""
say "total time: $(elapsed) s; overall: $([ $failed -eq 0 ] && echo PASS || echo FAIL)"
exit $failed
