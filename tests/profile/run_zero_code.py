"""End to end, profiling with no code in the program (Note [Zero-code profiling]):
tests/profile/zero_code_job.cpp, which marks nothing and only has a DistributedOptimizer, runs
under DTRAIN_PROFILE with its last rank sleeping in every step; dtrain-report on its files must
evaluate the step, communication and straggler rules, find the slowed rank by the straggler rule
and the scores, and say that the steps mark only their communication wait. With --no-optimizer
too, the same program without an optimizer: its report says that no steps were seen, and still
has the system and engine sections.

usage: run_zero_code.py --mpiexec M --mpiexec-args "-n;3" --ranks N --program P --report-tool R
                        --work DIR [--no-optimizer-too]
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

UPDATES, SLOW_MS = 50, 20
# Step outliers are judged from 101 steps on (SageMaker's default); this run has fewer.
THRESHOLDS = ["--threshold", "step_outlier_min_steps=30"]
EVALUATED = ("Communication bound", "Straggler rank", "Step outliers", "Initialization time")

failures = []


def check(ok: bool, what: str):
    if not ok:
        failures.append(what)
        print(f"FAIL: {what}", file=sys.stderr)


def run(command, env, timeout=240) -> subprocess.CompletedProcess:
    print("running:", " ".join(command), flush=True)
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    print(done.stdout + done.stderr)
    return done


def statuses(report_stdout: str) -> dict[str, str]:
    """Each rule's verdict as dtrain-report prints it: 'FINDING Title: ...', 'quiet: Title: ...'."""
    out = {}
    for line in report_stdout.splitlines():
        m = re.match(r"(FINDING|quiet:|not evaluated:|summary:) ([^:]+):", line)
        if m:
            out[m.group(2)] = {"FINDING": "fired"}.get(m.group(1), m.group(1).rstrip(":"))
    return out


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--mpiexec", required=True)
    p.add_argument("--mpiexec-args", default="")
    p.add_argument("--ranks", type=int, required=True)
    p.add_argument("--program", required=True)
    p.add_argument("--report-tool", required=True)
    p.add_argument("--work", required=True, type=Path)
    p.add_argument("--no-optimizer-too", action="store_true")
    a = p.parse_args()
    shutil.rmtree(a.work, ignore_errors=True)
    a.work.mkdir(parents=True)
    launcher = [a.mpiexec] + [x for x in a.mpiexec_args.split(";") if x]
    slow = a.ranks - 1

    profile = a.work / "profile"
    env = dict(os.environ, DTRAIN_PROFILE=str(profile), DTRAIN_PROFILE_INTERVAL_MS="100")
    job = run(launcher + [a.program, "--updates", str(UPDATES), "--slow-rank", str(slow),
                          "--slow-ms", str(SLOW_MS)], env)
    if job.returncode != 0:
        print(f"FAIL: the job exited with {job.returncode}", file=sys.stderr)
        return 1
    # One folder for the run (Note [Profile layout]), named by its run id, with a file per rank.
    runs = sorted(profile.iterdir())
    check(len(runs) == 1 and runs[0].is_dir(), f"not one run folder in {profile}: {runs}")
    run_folder = runs[0]
    check(sorted(f.name for f in run_folder.iterdir()) ==
          sorted(f"rank-{r}.jsonl" for r in range(a.ranks)), "not one profile file per rank")
    for r in range(a.ranks):
        records = [json.loads(x) for x in (run_folder / f"rank-{r}.jsonl").read_text()
                   .splitlines() if x.strip()]
        check(records[0]["run_id"] == run_folder.name, f"rank {r}: run id "
              f"{records[0]['run_id']} in folder {run_folder.name}")
        steps = [x["step"] for x in records if x["type"] == "step"]
        check(steps == list(range(UPDATES - 1)),
              f"rank {r}: steps {steps[:5]}... ({len(steps)}), expected 0-{UPDATES - 2}")
    html = a.work / "report.html"
    report = run([sys.executable, a.report_tool, str(profile), "-o", str(html)] + THRESHOLDS, env)
    text = " ".join(report.stdout.split())
    check(report.returncode == 0, f"dtrain-report exited with {report.returncode}")
    check(f"{a.ranks} of {a.ranks} rank(s)" in text, "the report does not cover every rank")
    check("note: the steps mark only their communication wait" in text,
          "the report does not say that the steps mark only their communication wait")
    verdicts = statuses(report.stdout)
    for rule in EVALUATED:
        check(verdicts.get(rule) in ("fired", "quiet"),
              f"the rule '{rule}' was not evaluated: {verdicts.get(rule)}")
    straggler = re.search(r"FINDING Straggler rank: (.*?) holds the others back", text)
    check(straggler is not None and straggler.group(1) == f"rank {slow}",
          f"the straggler rule does not name rank {slow}: "
          f"{straggler.group(1) if straggler else 'it did not fire'}")
    check(f"rank {slow}'s straggler score" in text,
          f"the straggler scores do not name rank {slow}")
    page = html.read_text() if html.exists() else ""
    check(f"<li>rank {slow}: under" in page, f"the page's scores do not name rank {slow}")

    if a.no_optimizer_too:
        bare = a.work / "no-optimizer"
        env["DTRAIN_PROFILE"] = str(bare)
        job = run(launcher + [a.program, "--no-optimizer"], env)
        check(job.returncode == 0, f"the job without an optimizer exited with {job.returncode}")
        bare_html = a.work / "no-optimizer.html"
        report = run([sys.executable, a.report_tool, str(bare), "-o", str(bare_html)], env)
        text = " ".join(report.stdout.split())
        check(report.returncode == 0, f"dtrain-report exited with {report.returncode}")
        check("note: no steps seen" in text, "the report has no 'no steps seen' line")
        check(statuses(report.stdout).get("Overall system usage") == "summary",
              "the report has no system usage summary")
        page = bare_html.read_text() if bare_html.exists() else ""
        check("From the system samples (no steps)" in page and
              "<td class=l>collectives</td>" in page,
              "the page has no engine counters from the samples")

    if failures:
        print(f"{len(failures)} check(s) failed", file=sys.stderr)
        return 1
    print("profiled without code: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
