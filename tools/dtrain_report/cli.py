"""dtrain-report's command line: read the profiles, judge them, print the findings, write the
HTML report."""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

from . import thresholds as threshold_config
from .analysis import analyze, notices
from .html_report import render, summary_line
from .profile_reader import ProfileError, list_runs, load_run
from .rules import FIRED, NOT_EVALUATED, QUIET, SUMMARY, evaluate

DESCRIPTION = """\
Merge the per-rank profiles that dtrain wrote (DTRAIN_PROFILE=DIR) into one
self-contained HTML report with charts and rule findings, and print the findings."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dtrain-report", description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="thresholds (NAME default meaning):\n"
               + textwrap.indent(threshold_config.describe(), "  "))
    p.add_argument("paths", nargs="*", type=Path, metavar="PATH",
                   help="the profile folder (or a run's folder in it, or rank-<r>.jsonl files)")
    p.add_argument("--run", metavar="ID",
                   help="the run to report when the folder holds several (default: the newest): "
                        "a run id, a dtrainrun job id (its newest attempt), or a run's folder "
                        "such as JOB/attempt-1")
    p.add_argument("--attempt", type=int, metavar="N",
                   help="attempt N of a dtrainrun job (the job of --run, or of the newest run): "
                        "0 is the first world, each restart or resize one more")
    p.add_argument("--list-runs", action="store_true",
                   help="list the runs found (newest first) and exit")
    p.add_argument("-o", "--output", type=Path, default=Path("report.html"),
                   help="the HTML file to write (default: report.html)")
    p.add_argument("--threshold", action="append", default=[], metavar="NAME=VALUE",
                   help="change a rule's threshold (repeatable)")
    p.add_argument("--thresholds", type=Path, metavar="FILE.json",
                   help="thresholds from a JSON object of names to numbers")
    p.add_argument("--list-thresholds", action="store_true",
                   help="print the thresholds with their defaults and exit")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="print only the fired findings and problems")
    return p


def _wrap(text: str, indent: str) -> str:
    return textwrap.fill(text, width=100, initial_indent=indent, subsequent_indent=" " * len(indent) + "  ")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.list_thresholds:
        print(threshold_config.describe())
        return 0
    if not args.paths:
        _parser().error("name the profile folder, e.g. dtrain-report prof -o report.html")
    try:
        limits = threshold_config.load(args.thresholds, args.threshold)
    except threshold_config.ThresholdError as e:
        print(f"dtrain-report: {e}", file=sys.stderr)
        return 2
    if args.attempt is not None and args.attempt < 0:
        _parser().error(f"--attempt {args.attempt}: attempts count from 0")
    if args.list_runs:
        try:
            runs = list_runs(args.paths)
        except ProfileError as e:
            print(f"dtrain-report: {e}", file=sys.stderr)
            return 1
        for r in reversed(runs):
            print(r.describe())
        return 0
    try:
        run = load_run(args.paths, args.run, args.attempt)
    except ProfileError as e:
        print(f"dtrain-report: {e}", file=sys.stderr)
        return 1
    analysis = analyze(run, limits)
    findings = evaluate(analysis)

    out = sys.stdout
    print(f"dtrain-report: {summary_line(analysis)}", file=out)
    for n in notices(analysis):
        print(_wrap(n, "note: "), file=out)
    for f in findings:
        if f.status == FIRED:
            print(_wrap(f"{f.title}: {f.summary}", "FINDING "), file=out)
            for e in f.evidence:
                print(_wrap(e, "  - "), file=out)
            print(_wrap(f"suggestion: {f.suggestion}", "  "), file=out)
    if not args.quiet:
        for status in (QUIET, NOT_EVALUATED, SUMMARY):
            for f in findings:
                if f.status == status:
                    print(_wrap(f"{f.title}: {f.summary}", f"{status}: "), file=out)
                    if status == SUMMARY:
                        for e in f.evidence:
                            print(_wrap(e, "  - "), file=out)
    for s in run.skipped:
        print(_wrap(s, "skipped: "), file=out)

    html = render(analysis, findings)
    try:
        args.output.write_text(html, encoding="utf-8")
    except OSError as e:
        print(f"dtrain-report: cannot write the report '{args.output}': {e.strerror or e}; "
              f"choose another path with -o", file=sys.stderr)
        return 1
    print(f"dtrain-report: wrote {args.output} ({len(html) // 1024} KiB)", file=out)
    return 0
