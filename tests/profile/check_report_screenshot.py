"""Opens a dtrain-report page in headless Chromium and checks what a reader would see: the page
renders (a screenshot that is not blank), and the charts are there (in the DOM Chromium built,
and as their colors in the screenshot). Exits 77 (skipped) when no Chromium is installed, 1
with DTRAIN_TEST_REQUIRE_BROWSER=1 (tools/run-tests.sh, which installs it).

usage: check_report_screenshot.py REPORT.html SCREENSHOT.png
"""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from png import color_counts, read_png  # noqa: E402

SKIP = 77
WIDTH, HEIGHT = 1000, 4200
CHARTS = ("chart-step-breakdown", "chart-step-timeline", "chart-comm-compute",
          "chart-comm-compute-steps", "chart-straggler-heatmap", "chart-straggler-scores",
          "chart-utilization")
# Colors only the charts draw, as solid fills: (what, RGB). The report is of the plain example
# trainer, which marks no phase: its steps are own work (or "other") and communication wait.
SIGNATURES = (
    ("communication wait bars", (0xe4, 0x57, 0x56)),
    ("own work and 'other' bars", (0xba, 0xb0, 0xac)),
    ("straggler heatmap scale, 0.5x end", (0x21, 0x66, 0xac)),
    ("straggler heatmap scale, 2x end", (0xb2, 0x18, 0x2b)),
)
MIN_PIXELS = 40


def chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if path := shutil.which(name):
            return path
    return None


def run_browser(browser: str, *args: str) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run(
            [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             "--no-first-run", "--disable-extensions", f"--user-data-dir={profile}", *args],
            capture_output=True, text=True, timeout=180)


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    report, shot = Path(sys.argv[1]).resolve(), Path(sys.argv[2])
    browser = chromium()
    if browser is None:
        required = os.environ.get("DTRAIN_TEST_REQUIRE_BROWSER") == "1"
        print(f"{'FAIL' if required else 'SKIP'}: no Chromium found (Debian: apt-get install "
              f"chromium, or tools/install-deps.sh --browser)")
        return 1 if required else SKIP
    if not report.is_file():
        print(f"FAIL: no report at {report} (the profiled-run test makes it)", file=sys.stderr)
        return 1
    failures = []

    dom = run_browser(browser, "--dump-dom", report.as_uri())
    if dom.returncode != 0:
        failures.append(f"chromium --dump-dom exited with {dom.returncode}: {dom.stderr[-2000:]}")
    for chart in CHARTS:
        start = dom.stdout.find(f'id="{chart}"')
        end = dom.stdout.find("</svg>", start)
        shapes = sum(dom.stdout.count(tag, start, end) for tag in ("<rect", "<polyline",
                                                                    "<polygon"))
        if start < 0 or shapes < 3:
            failures.append(f"{chart}: {'missing from' if start < 0 else 'empty in'} the DOM "
                            f"Chromium built")

    shot.unlink(missing_ok=True)
    made = run_browser(browser, f"--window-size={WIDTH},{HEIGHT}", f"--screenshot={shot.resolve()}",
                       report.as_uri())
    if made.returncode != 0 or not shot.is_file():
        failures.append(f"no screenshot (chromium exited with {made.returncode}): "
                        f"{made.stderr[-2000:]}")
    else:
        width, height, channels, rows = read_png(shot.read_bytes())
        counts = color_counts(rows, channels)
        total = width * height
        background = sum(n for (r, g, b), n in counts.items() if min(r, g, b) >= 245)
        inked = 1 - background / total
        print(f"screenshot {shot}: {width}x{height}, {len(counts)} colors, "
              f"{100 * inked:.1f}% of pixels not background")
        if len(counts) < 50 or inked < 0.03:
            failures.append(f"the screenshot is blank: {len(counts)} colors, "
                            f"{100 * inked:.2f}% of pixels drawn")
        for what, rgb in SIGNATURES:
            n = sum(c for px, c in counts.items()
                    if all(abs(a - b) <= 2 for a, b in zip(px, rgb)))
            print(f"  {what} #{'%02x%02x%02x' % rgb}: {n} pixels")
            if n < MIN_PIXELS:
                failures.append(f"the screenshot shows no {what} (#{'%02x%02x%02x' % rgb}): "
                                f"{n} pixels")
    for f in failures:
        print(f"FAIL: {f}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
