#!/usr/bin/env python3
"""How long dtrain-report takes on a long run: a synthetic profile of 100k steps on each of 4 ranks
(as dtrain writes it: phases, engine counters, a system sample every 0.5 s; tests/profile/
synthetic.py), then tools/dtrain-report on it, timed from start to exit.

    python3 benchmarks/report_speed.py                     # 100k steps x 4 ranks, budget 30 s
    python3 benchmarks/report_speed.py --steps 20000 --ranks 8 --keep /tmp/prof

Prints the size of the profile, then
    RESULT steps=<n> ranks=<r> profile_mb=<size> seconds=<wall> cpu_seconds=<user+sys>
and exits 1 when the report took longer than --budget seconds (0: no budget) or failed. The work
is linear in the steps (tests/profile/test_report_scaling.py counts it); this says how fast.
"""

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "profile"))
import synthetic  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=100_000, help="steps per rank (default 100000)")
    p.add_argument("--ranks", type=int, default=4, help="ranks (default 4)")
    p.add_argument("--budget", type=float, default=30.0,
                   help="seconds the report may take (default 30; 0: no budget)")
    p.add_argument("--keep", type=Path, metavar="DIR",
                   help="write the profile and the report into DIR and keep them")
    a = p.parse_args()
    if a.steps < 1 or a.ranks < 1:
        p.error("--steps and --ranks must be at least 1")
    with tempfile.TemporaryDirectory() as tmp:
        work = a.keep or Path(tmp)
        folder = work / "profile"
        started = time.perf_counter()
        synthetic.write_run(folder, ranks=a.ranks, steps=a.steps)
        size_mb = sum(f.stat().st_size for f in folder.glob("*.jsonl")) / 1e6
        print(f"wrote {a.ranks} x {a.steps} steps ({size_mb:.0f} MB) in "
              f"{time.perf_counter() - started:.1f} s into {folder}", flush=True)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        done = subprocess.run([sys.executable, str(ROOT / "tools" / "dtrain-report"), str(folder),
                               "-o", str(work / "report.html"), "-q"],
                              env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
        seconds = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    print(f"RESULT steps={a.steps} ranks={a.ranks} profile_mb={size_mb:.0f} "
          f"seconds={seconds:.1f} cpu_seconds={cpu:.1f}")
    if done.returncode != 0:
        print(f"FAIL: dtrain-report exited {done.returncode}", file=sys.stderr)
        return 1
    if a.budget > 0 and seconds > a.budget:
        print(f"FAIL: {seconds:.1f} s, over the budget of {a.budget:g} s (load average "
              f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
