"""End to end: the plain example trainer, which has no line of profiling code, profiled on 2 ranks
(DTRAIN_PROFILE: Note [Zero-code profiling]), then dtrain-report on its files. Checks the profile
against what the trainer did (a step from one optimizer update to the next, their communication
wait, bytes reduced per step in closed form) and that the report holds every chart and every
rule. Leaves the report at WORK/report.html for the screenshot check. Then the same trainer
killed mid-run (rank 1 kills itself with SIGKILL): the report on what its ranks left says that
the job did not end cleanly.

usage: run_profiled_example.py --mpiexec M --mpiexec-args "-n;2" --trainer T --report-tool R
                               --work DIR
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

# Long enough (a few seconds) for the 100 ms sampler to record system samples on every rank.
EPOCHS, SAMPLES, HIDDEN, RANKS = 4, 6000, 512, 2
PHASES = {"communication_wait"}  # all the trainer's steps have without marks of its own
CHARTS = ("chart-step-breakdown", "chart-step-timeline", "chart-comm-compute",
          "chart-comm-compute-steps", "chart-straggler-heatmap", "chart-straggler-scores",
          "chart-utilization")
RULES = ("Low GPU utilization", "Data-loader bound", "Communication bound", "Straggler rank",
         "Batch too small for the device", "CPU oversubscribed", "Engine busy-waiting",
         "Step outliers", "Initialization time", "GPU memory increase", "I/O bottleneck",
         "GPU load balancing", "Overall system usage")
# The killed run: a wider model (slower steps) and more of them, so that the steps before the kill
# have had time to reach the file (the profile writer flushes every 250 ms, not every step): the
# kill comes after 1200 steps, at least half a second in even on a fast, idle machine (200 steps
# once took under 0.1 s, and the kill came before the first flush).
KILLED_HIDDEN, KILLED_SAMPLES, KILLED_AFTER_STEP = 2048, 30000, 1200

failures = []


def check(ok: bool, what: str):
    if not ok:
        failures.append(what)
        print(f"FAIL: {what}", file=sys.stderr)


def run_folder(profile: Path) -> Path:
    """The one run's folder in the profile folder (Note [Profile layout]): <profile>/<run-id>/."""
    runs = sorted(profile.iterdir()) if profile.is_dir() else []
    check(len(runs) == 1 and runs[0].is_dir(), f"not one run folder in {profile}: {runs}")
    return runs[0] if runs else profile


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--mpiexec", required=True)
    p.add_argument("--mpiexec-args", default="")
    p.add_argument("--trainer", required=True)
    p.add_argument("--report-tool", required=True)
    p.add_argument("--work", required=True, type=Path)
    a = p.parse_args()

    profile = a.work / "profile"
    report = a.work / "report.html"
    shutil.rmtree(a.work, ignore_errors=True)
    a.work.mkdir(parents=True)
    env = dict(os.environ, DTRAIN_PROFILE=str(profile), DTRAIN_PROFILE_INTERVAL_MS="100")
    def trainer_command(hidden, samples=SAMPLES):
        return [a.mpiexec] + [x for x in a.mpiexec_args.split(";") if x] + \
            [a.trainer, "--epochs", str(EPOCHS), "--samples", str(samples), "--hidden", str(hidden)]
    command = trainer_command(HIDDEN)
    print("running:", " ".join(command), flush=True)
    trained = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    print(trained.stdout + trained.stderr)
    if trained.returncode != 0:
        print(f"FAIL: the trainer exited with {trained.returncode}", file=sys.stderr)
        return 1
    steps_per_epoch = int(re.search(r"(\d+) steps/epoch", trained.stdout).group(1))

    # The profile itself: a step from each optimizer update to the next (N updates, N - 1 steps),
    # their communication wait, the gradient bytes; the steps that hold an epoch's end also
    # average the epoch's metrics.
    gradient_bytes = (2 * HIDDEN + HIDDEN + 3 * HIDDEN + 3) * 4  # w1, b1, w2, b2 in float32
    updates = EPOCHS * steps_per_epoch
    epoch_ends = {(e + 1) * steps_per_epoch - 1 for e in range(EPOCHS - 1)}
    run = run_folder(profile)
    for r in range(RANKS):
        records = [json.loads(line) for line in (run / f"rank-{r}.jsonl").read_text()
                   .splitlines() if line.strip()]
        steps = [x for x in records if x["type"] == "step"]
        check([s["step"] for s in steps] == list(range(updates - 1)),
              f"rank {r}: {len(steps)} steps recorded, expected steps 0-{updates - 2}")
        check(records[-1]["type"] == "end", f"rank {r}: the file does not end with an end record")
        samples = [x for x in records if x["type"] == "sample"]
        check(bool(samples), f"rank {r}: no system sample")
        check(sum(x.get("engine", {}).get("collectives", 0) for x in samples) >= updates,
              f"rank {r}: the samples do not see the engine's collectives")
        for s in steps:
            check(set(s["phases_ms"]) == PHASES, f"rank {r} step {s['step']}: phases "
                  f"{sorted(s['phases_ms'])}")
            check(s["samples"] == 0, f"rank {r} step {s['step']}: samples {s['samples']}")
            reduced, epoch_end = s["engine"]["bytes_reduced"], s["step"] in epoch_ends
            check(reduced > gradient_bytes if epoch_end else reduced == gradient_bytes,
                  f"rank {r} step {s['step']}: {reduced} bytes reduced, expected the "
                  f"{gradient_bytes} gradient bytes{' and the metrics' if epoch_end else ''}")
            if failures:
                break

    reported = subprocess.run([sys.executable, a.report_tool, str(profile), "-o", str(report)],
                              capture_output=True, text=True, timeout=300)
    print(reported.stdout + reported.stderr)
    check(reported.returncode == 0, f"dtrain-report exited with {reported.returncode}")
    check(f"{RANKS} of {RANKS} rank(s) on 1 host(s)" in reported.stdout,
          "the report does not cover both ranks")
    check("skipped:" not in reported.stdout, "the report skipped input from a clean run")
    check("note: the steps mark only their communication wait" in " ".join(
        reported.stdout.split()), "the report does not say what the steps mark")
    html = report.read_text() if report.exists() else ""
    for chart in CHARTS:
        check(f'id="{chart}"' in html, f"the report lacks {chart}")
    for rule in RULES:
        check(f"<h3>{rule}</h3>" in html, f"the report lacks the rule '{rule}'")
    # The same job killed: rank 1 raises SIGKILL after a step, the launcher ends rank 0.
    killed = a.work / "killed"
    env["DTRAIN_PROFILE"] = str(killed)
    crashed = subprocess.run(
        trainer_command(KILLED_HIDDEN, KILLED_SAMPLES) +
        ["--crash-rank", "1", "--crash-after-step", str(KILLED_AFTER_STEP)],
        env=env, capture_output=True, text=True, timeout=300)
    check(crashed.returncode != 0, "the trainer told to kill a rank exited with 0")
    reported = subprocess.run([sys.executable, a.report_tool, str(killed), "-o",
                               str(a.work / "killed.html")], capture_output=True, text=True,
                              timeout=300)
    print(reported.stdout + reported.stderr)
    text = " ".join(reported.stdout.split())
    check(reported.returncode == 0, f"dtrain-report on the killed job exited with "
          f"{reported.returncode}")
    check("note: the job did not end cleanly" in text and "rank 1 at step" in text,
          "the report on the killed job does not say that rank 1 did not end cleanly")
    steps = [json.loads(line)["step"] for line in (run_folder(killed) / "rank-1.jsonl").read_text()
             .splitlines() if '"type":"step"' in line.replace(" ", "")]
    check(bool(steps) and max(steps) <= KILLED_AFTER_STEP,
          f"the killed rank recorded steps up to {max(steps, default=None)}, past the step it "
          f"was killed after ({KILLED_AFTER_STEP})")
    if failures:
        print(f"{len(failures)} check(s) failed", file=sys.stderr)
        return 1
    print(f"profiled run and report OK: {report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
