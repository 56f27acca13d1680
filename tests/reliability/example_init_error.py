"""An example trainer whose dtrain::init() fails (a malformed DTRAIN_CYCLE_TIME) prints the error
and exits with 1, alone and under mpiexec on every rank: no uncaught exception, no SIGABRT.

    example_init_error.py --mpiexec MPIEXEC --np N --name NAME -- PROGRAM [ARGS...]
"""
import argparse
import os
import subprocess
import sys

BAD_VALUE = "abc"
EXPECTED = f'DTRAIN_CYCLE_TIME="{BAD_VALUE}" is not a number'
CRASH_SIGNS = ("terminate called", "Aborted", "core dumped", "SIGABRT", "signal 6")


def run(argv, what):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DTRAIN", "HOROVOD_"))}
    env["DTRAIN_CYCLE_TIME"] = BAD_VALUE
    try:
        done = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, timeout=60, text=True, errors="replace")
    except subprocess.TimeoutExpired as e:
        return [f"{what}: did not end within 60 s; output: {e.output}"]
    problems = []
    if done.returncode != 1:
        problems.append(f"{what}: exit status {done.returncode}, expected 1")
    if EXPECTED not in done.stdout:
        problems.append(f"{what}: the output does not say {EXPECTED!r}")
    crashes = [sign for sign in CRASH_SIGNS if sign in done.stdout]
    if crashes:
        problems.append(f"{what}: the output shows a crash ({', '.join(crashes)})")
    if problems:
        problems.append(f"{what}: output:\n{done.stdout}")
    return problems


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mpiexec", required=True)
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--name", required=True)
    parser.add_argument("program", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    program = args.program[1:] if args.program[:1] == ["--"] else args.program
    problems = run(program, f"{args.name} alone")
    problems += run([args.mpiexec, "-n", str(args.np)] + program,
                    f"{args.name} under mpiexec -n {args.np}")
    for p in problems:
        print(f"FAILED: {p}")
    if not problems:
        print(f"{args.name}: an init error is printed and ends every rank with 1")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
