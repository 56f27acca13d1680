#!/usr/bin/env python3
"""Runs Python unittest tests for ctest, which knows passed, failed and skipped but not a test
file whose cases were partly skipped: `python3 -m unittest` exits 0 when cases are skipped, so
ctest would report a skip as a pass.

    run_unittest.py [--exclude NAME ...] NAME ...              (modules, classes or tests)
    run_unittest.py --start-dir DIR --pattern GLOB [--exclude NAME ...]

Names are imported from the working directory, as `python3 -m unittest` does. Exit status: 0
when every test ran and passed; 1 when one failed or none ran; 77 (ctest's SKIP_RETURN_CODE)
when none failed but some were skipped, listing them and why. verdict() gives the same answer
for a result that a test file's own main() got.
"""
import argparse
import os
import sys
import unittest

SKIPPED = 77


def verdict(result, required=False):
    """The exit status for `result`; `required`: a skip is a failure (the machine is set up to
    run everything)."""
    if not result.wasSuccessful():
        return 1
    if result.testsRun == 0:
        print("FAILED: no test ran")
        return 1
    if result.skipped:
        print(f"{'FAILED' if required else 'SKIPPED'}: {len(result.skipped)} of "
              f"{result.testsRun} tests did not run:")
        for test, reason in result.skipped:
            print(f"  {test.id()}: {reason}")
        return 1 if required else SKIPPED
    return 0


def flatten(suite):
    for item in suite:
        if isinstance(item, unittest.TestSuite):
            yield from flatten(item)
        else:
            yield item


def excluded(test_id, prefixes):
    return any(test_id == p or test_id.startswith(p + ".") for p in prefixes)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*")
    parser.add_argument("--start-dir")
    parser.add_argument("--pattern", default="test*.py")
    parser.add_argument("--exclude", action="append", default=[])
    args = parser.parse_args()
    if bool(args.names) == bool(args.start_dir):
        parser.error("give test names or --start-dir, not both")
    sys.path.insert(0, os.getcwd())
    loader = unittest.TestLoader()
    if args.start_dir:
        found = loader.discover(args.start_dir, pattern=args.pattern)
    else:
        found = loader.loadTestsFromNames(args.names)
    # A name that does not import becomes a test that fails (unittest's _FailedTest): kept.
    tests = [t for t in flatten(found) if not excluded(t.id(), args.exclude)]
    result = unittest.TextTestRunner(verbosity=2, stream=sys.stdout).run(
        unittest.TestSuite(tests))
    return verdict(result)


if __name__ == "__main__":
    sys.exit(main())
