#!/usr/bin/env bash
# How long a file that uses dtrain takes to compile, and how much memory the compiler needs:
# the one-allreduce file (compile_time/one_allreduce.cpp) in the compiled mode (dtrain::dtrain)
# and the header-only mode (dtrain::header_only) beside the same program written with MPI and
# {fmt}; a file with <dtrain/torch.hpp> beside one with only <torch/torch.h>; at -O0 and -O2.
# Each command is the build's own (compile_commands.json), run REPEAT times; the minimum is kept
# (the machine's noise only ever adds time). With --full-build it also times a clean build of
# everything (tests, examples, benchmarks) in a scratch copy of the build folder's configuration.
#
#   benchmarks/compile_time.sh BUILD_DIR [--repeat N] [--full-build]
#
# The probes (benchmarks/compile_time/) are not part of the normal build; their compile commands
# come from BUILD_DIR's compile_commands.json (the script turns CMAKE_EXPORT_COMPILE_COMMANDS on
# and reconfigures when the file is missing). Prints a Markdown table for docs/performance.md.
set -euo pipefail
build=${1:?usage: compile_time.sh BUILD_DIR [--repeat N] [--full-build]}
shift
repeat=3
full=0
while [ $# -gt 0 ]; do
  case "$1" in
    --repeat) repeat=$2; shift 2 ;;
    --full-build) full=1; shift ;;
    *) echo "compile_time.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
build=$(cd "$build" && pwd)
if [ ! -f "$build/compile_commands.json" ]; then
  cmake -S "$(dirname "$0")/.." -B "$build" -DCMAKE_EXPORT_COMPILE_COMMANDS=ON >/dev/null
fi
# The probes' commands need the headers generated for them (precompiled libtorch headers).
cmake --build "$build" --target compile_time_dtrain_torch compile_time_torch_only \
  >/dev/null 2>&1 || true
cmake --build "$build" --target dtrain >/dev/null  # the library the compiled mode links

python3 - "$build" "$repeat" <<'PY'
import json, os, re, shlex, subprocess, sys, tempfile
build, repeat = sys.argv[1], int(sys.argv[2])
commands = json.load(open(os.path.join(build, "compile_commands.json")))
def command_of(target, source):
    for c in commands:
        if c["file"].endswith(source) and f"/{target}.dir/" in c.get("output", c["command"]):
            return c
    return None
def measure(entry, opt):
    argv = shlex.split(entry["command"])
    argv = [a for a in argv if not re.fullmatch(r"-O[0-3sg]?|-g[0-3]?", a)]
    out = tempfile.mktemp(suffix=".o")
    i = argv.index("-o")
    argv[i + 1] = out
    argv.insert(1, opt)
    best_s, best_kb = None, None
    for _ in range(repeat):
        timing = tempfile.mktemp()
        subprocess.run(["/usr/bin/time", "-o", timing, "-f", "%U %S %M"] + argv,
                       cwd=entry["directory"], check=True, stdout=subprocess.DEVNULL)
        user, system, kb = open(timing).read().split()[-3:]
        s = float(user) + float(system)
        best_s = s if best_s is None else min(best_s, s)
        best_kb = int(kb) if best_kb is None else min(best_kb, int(kb))
        os.remove(timing)
    if os.path.exists(out):
        os.remove(out)
    return best_s, best_kb / 1024
rows = [("MPI + {fmt}", "compile_time_mpi_fmt", "mpi_fmt.cpp"),
        ("dtrain, compiled (dtrain::dtrain)", "compile_time_compiled", "one_allreduce.cpp"),
        ("dtrain, header-only", "compile_time_header_only", "one_allreduce.cpp"),
        ("<torch/torch.h> only", "compile_time_torch_only", "torch_only.cpp"),
        ("<dtrain/torch.hpp>, compiled", "compile_time_dtrain_torch", "dtrain_torch.cpp")]
print("| file | -O0 CPU s | -O0 peak MB | -O2 CPU s | -O2 peak MB | -O2 vs MPI + {fmt} |")
print("|---|---|---|---|---|---|")
base = None
ratios = {}
for label, target, source in rows:
    entry = command_of(target, source)
    if entry is None:
        print(f"| {label} | not built here | | | | |")
        continue
    o0 = measure(entry, "-O0")
    o2 = measure(entry, "-O2")
    if base is None:
        base = o2[0]
    ratios[target] = o2[0] / base
    print(f"| {label} | {o0[0]:.2f} | {o0[1]:.0f} | {o2[0]:.2f} | {o2[1]:.0f} | "
          f"{o2[0] / base:.2f}x |")
if "compile_time_compiled" in ratios:
    print(f"\ncompiled mode: a file with one allreduce takes {ratios['compile_time_compiled']:.2f}x "
          f"the CPU time of the same file written with MPI and {{fmt}} (-O2)")
PY

if [ "$full" = 1 ]; then
  scratch=$(mktemp -d)
  trap 'rm -rf "$scratch"' EXIT
  cache_args=()
  for var in CMAKE_BUILD_TYPE CMAKE_PREFIX_PATH DTRAIN_MPI DTRAIN_REQUIRE_TORCH MASK_RCNN_PYTHON; do
    value=$(sed -n "s/^$var:[A-Z]*=//p" "$build/CMakeCache.txt")
    [ -n "$value" ] && cache_args+=("-D$var=$value")
  done
  cmake -S "$(dirname "$0")/.." -B "$scratch" "${cache_args[@]}" >/dev/null
  start=$(date +%s)
  cmake --build "$scratch" -j "$(nproc)" >/dev/null
  echo
  echo "Clean build of everything, $(nproc) jobs: $(( $(date +%s) - start )) s"
fi
