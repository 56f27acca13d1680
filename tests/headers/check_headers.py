#!/usr/bin/env python3
"""Every header under include/dtrain compiles on its own (SPEC §1), in the build mode given.

    check_headers.py --include-dir DIR --flags-file FILE [--mode compiled|header-only]
                     [--skip PREFIX ...] [--only-with-impl] [--jobs N]

Each header becomes a translation unit holding only `#include <dtrain/...>`, checked with
`-fsyntax-only` and the flags in FLAGS_FILE (one argument per line: the compiler first, then the
include directories and definitions dtrain::header_only gives its users). Headers under a skipped
prefix (torch/ without libtorch, cuda/ without the CUDA toolkit) are listed and left out.
--only-with-impl keeps the headers that have definitions of their own (x_impl.hpp beside x.hpp,
or in the detail/ folder beside it): in header-only mode those are the ones that pull the engine in
at their end. Exit
status 0 when every header compiled; 1 with each failure's compiler output otherwise.
"""
import argparse
import concurrent.futures
import os
import subprocess
import sys
import tempfile


# The compiler's own search directories: naming them again (as -isystem) reorders them and breaks
# the C++ library's #include_next of the C headers.
DEFAULT_DIRS = {"/usr/include", "/usr/local/include"}


def without_default_dirs(flags):
    out, i = [], 0
    while i < len(flags):
        if flags[i] in ("-isystem", "-I") and i + 1 < len(flags) and flags[i + 1] in DEFAULT_DIRS:
            i += 2
            continue
        if flags[i].startswith("-I") and flags[i][2:] in DEFAULT_DIRS:
            i += 1
            continue
        out.append(flags[i])
        i += 1
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--include-dir", required=True)
    parser.add_argument("--flags-file", required=True)
    parser.add_argument("--mode", choices=("compiled", "header-only"), default="compiled")
    parser.add_argument("--skip", action="append", default=[])
    parser.add_argument("--only-with-impl", action="store_true")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()

    with open(args.flags_file) as f:
        argv = [line.strip() for line in f if line.strip()]
    compiler, flags = argv[0], without_default_dirs(argv[1:])
    if args.mode == "compiled":
        flags.append("-DDTRAIN_COMPILED_LIB")
    root = os.path.join(args.include_dir, "dtrain")
    headers, skipped = [], []
    for dirpath, _, files in os.walk(root):
        for name in files:
            if not name.endswith(".hpp"):
                continue
            rel = os.path.relpath(os.path.join(dirpath, name), args.include_dir)
            impl = name[:-len(".hpp")] + "_impl.hpp"
            beside = (os.path.join(dirpath, impl), os.path.join(dirpath, "detail", impl))
            if args.only_with_impl and not any(os.path.exists(p) for p in beside):
                continue
            (skipped if any(rel.startswith(p) for p in args.skip) else headers).append(rel)
    headers.sort()
    if not headers:
        print(f"no headers found under {root}")
        return 1

    with tempfile.TemporaryDirectory() as work:
        def check(header):
            source = os.path.join(work, header.replace("/", "_") + ".cpp")
            with open(source, "w") as f:
                f.write(f"#include <{header}>\n")
            done = subprocess.run([compiler, *flags, "-fsyntax-only", source],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            return header, done.returncode, done.stdout

        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            results = list(pool.map(check, headers))
    failures = [(h, out) for h, rc, out in results if rc != 0]
    for header, out in failures:
        print(f"FAILED: {header} does not compile on its own ({args.mode}):\n{out}")
    print(f"{len(headers) - len(failures)} of {len(headers)} headers compile on their own "
          f"({args.mode}); skipped: {', '.join(sorted(skipped)) or 'none'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
