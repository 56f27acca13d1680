"""The rules' thresholds: defaults, meanings, and overrides from the command line or a JSON file."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Threshold:
    default: float
    meaning: str
    minimum: float = 0.0
    maximum: float = math.inf
    integer: bool = False


THRESHOLDS: dict[str, Threshold] = {
    "warmup_steps": Threshold(
        2, "steps at the start of each rank's profile left out of the rules (first-step costs: "
        "negotiation, buffer allocation, caches)", integer=True),
    "min_steps": Threshold(
        3, "fewest steps (after warm-up) for the step-based rules to judge", 1, integer=True),
    "gpu_utilization_low_pct": Threshold(
        70, "median GPU utilization below this is low", 0, 100),
    "gpu_memory_low_fraction": Threshold(
        0.5, "median GPU memory in use, as a fraction of the device's, below which a batch "
        "could grow", 0, 1),
    "data_share_high": Threshold(
        0.2, "median fraction of a step spent in the data phase from which a rank is "
        "data-loader bound", 0, 1),
    "communication_share_high": Threshold(
        0.3, "median fraction of a step spent waiting for communication, on the rank that waits "
        "least, from which the job is communication bound", 0, 1),
    "straggler_slowdown": Threshold(
        1.15, "a rank whose own work per step (step minus communication wait) takes this many "
        "times the other ranks' is a straggler", 1),
    "straggler_min_ms": Threshold(
        0.5, "and takes at least this many milliseconds longer per step"),
    "straggler_step_fraction": Threshold(
        0.5, "and is the slowest rank in at least this fraction of the steps", 0, 1),
    "cpu_busy_pct": Threshold(
        90, "median whole-machine CPU use from which a host's CPUs count as saturated", 0, 100),
    "runnable_per_cpu": Threshold(
        1.0, "median runnable tasks per CPU above which a saturated host is oversubscribed "
        "(tasks wait for a core)"),
}


class ThresholdError(Exception):
    pass


def defaults() -> dict[str, float]:
    return {name: t.default for name, t in THRESHOLDS.items()}


def _set(values: dict[str, float], name: str, raw, origin: str) -> None:
    if name not in THRESHOLDS:
        raise ThresholdError(f"{origin}: unknown threshold {name!r}; known: "
                             + ", ".join(sorted(THRESHOLDS)))
    t = THRESHOLDS[name]
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise ThresholdError(f"{origin}: threshold {name} = {raw!r} is not a number") from None
    if not math.isfinite(value) or value < t.minimum or value > t.maximum:
        limits = f"from {t.minimum:g}" + (f" to {t.maximum:g}" if math.isfinite(t.maximum) else "")
        raise ThresholdError(f"{origin}: threshold {name} = {raw!r} is out of range: expected "
                             f"a number {limits}")
    if t.integer and value != int(value):
        raise ThresholdError(f"{origin}: threshold {name} = {raw!r} must be a whole number")
    values[name] = int(value) if t.integer else value


def load(file: Path | None, assignments: list[str]) -> dict[str, float]:
    """Defaults, then the JSON file's values, then NAME=VALUE assignments."""
    values = defaults()
    if file is not None:
        try:
            data = json.loads(file.read_text())
        except OSError as e:
            raise ThresholdError(f"--thresholds {file}: cannot be read ({e.strerror or e})") \
                from None
        except json.JSONDecodeError as e:
            raise ThresholdError(f"--thresholds {file}: not JSON ({e})") from None
        if not isinstance(data, dict):
            raise ThresholdError(f"--thresholds {file}: expected a JSON object of "
                                 f"threshold names to numbers")
        for name, raw in data.items():
            _set(values, name, raw, f"--thresholds {file}")
    for a in assignments:
        name, sep, raw = a.partition("=")
        if not sep:
            raise ThresholdError(f"--threshold {a!r}: expected NAME=VALUE, e.g. "
                                 f"data_share_high=0.3")
        _set(values, name.strip(), raw.strip(), f"--threshold {a}")
    return values


def describe() -> str:
    width = max(map(len, THRESHOLDS))
    return "\n".join(f"{name:<{width}}  {t.default:<6g} {t.meaning}"
                     for name, t in THRESHOLDS.items())
