"""The largest numbers dtrainrun accepts, and the one parser for the counts it reads (options,
hostfiles, SLURM's and SageMaker's variables).

Note [Bounded counts]
Every count dtrainrun reads becomes something it builds: a rank count becomes a list of every
rank's host and the ranks named in a failure message, a SLURM repeat count a list of task counts,
a node range a list of host names. Unbounded, `-np 99999999999999999999` or
`SLURM_TASKS_PER_NODE=2(x99999999999)` made dtrainrun grow without end instead of answering, and a
number of more than 4300 digits stopped Python's int() with a traceback. So each count is checked
as text first (digits only, and not longer than the largest accepted number), then against its
range, and the message names where it came from, the value and the range.
"""
from __future__ import annotations

import re

from .errors import UsageError, shown

# 2**20 ranks: far above the largest data-parallel jobs run today (about 10**5 GPUs), and small
# enough that a list with an entry per rank costs dtrainrun a few megabytes.
MAX_RANKS = 1 << 20
MAX_RANKS_WHY = "the most ranks one job can have"
# A job that failed ten thousand times needs a person, not another restart.
MAX_RESTARTS = 10_000
# A hostfile lists at most MAX_RANKS hosts of a few dozen bytes each; reading stops here, so that
# `--hostfile /dev/zero` is refused instead of filling memory.
MAX_HOSTFILE_BYTES = 64 << 20

_DIGITS = re.compile(r"[0-9]+")


def parse_count(text: str, maximum: int):
    """The value of `text` when it is ASCII digits and at most `maximum`; None when it is not
    digits; maximum + 1 when it is digits but larger (never converting more digits than needed)."""
    if not _DIGITS.fullmatch(text):
        return None
    significant = text.lstrip("0") or "0"
    if len(significant) > len(str(maximum)):
        return maximum + 1
    return min(int(significant), maximum + 1)


def whole_number(option: str, text: str, minimum: int, maximum: int, why: str = "") -> int:
    """A command-line count: digits, at least `minimum`, at most `maximum` (`why` says what the
    maximum is)."""
    value = parse_count(text, maximum)
    if value is None:
        raise UsageError(f"dtrain: {option} expects a whole number, got {shown(text)}")
    if value < minimum:
        raise UsageError(f"dtrain: {option} {value}: must be at least {minimum}")
    if value > maximum:
        digits = shown(text, quote="")
        raise UsageError(f"dtrain: {option} {digits}: too large; {option} accepts "
                         f"{minimum} to {maximum}" + (f" ({why})" if why else ""))
    return value
