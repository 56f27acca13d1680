"""The rules' thresholds: defaults, meanings, and overrides from the command line or a JSON file."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path


SAGEMAKER = "SageMaker Debugger"
NVIDIA_STRAGGLER = "NVIDIA Resiliency Extension, straggler detection"


@dataclass(frozen=True)
class Threshold:
    default: float
    meaning: str
    minimum: float = 0.0
    maximum: float = math.inf
    integer: bool = False
    source: str = ""  # where the default comes from, when it is another tool's


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
    "engine_wait_cores": Threshold(
        0.5, "CPU the engine thread uses per second it spends executing collectives "
        "(engine_cpu_ns / collective_ns), in cores, from which a job across hosts waits for its "
        "peers by polling (a wait that sleeps uses a small fraction of a core)", 0),
    "engine_wait_share": Threshold(
        0.1, "and the fraction of the step the engine thread spends executing collectives "
        "(collective_ns), from which the cores it polls away are worth a finding", 0, 1),
    "straggler_score_low": Threshold(
        0.75, "a rank whose straggler score (the fastest rank's median own work per step over its "
        "own, per interval) is below this is named", 0, 1,
        source=f"{NVIDIA_STRAGGLER}: identify_stragglers(), relative thresholds"),
    "straggler_score_interval_steps": Threshold(
        50, "steps per straggler-score interval", 1, integer=True),
    "step_outlier_stddev": Threshold(
        3, "a step longer than the rank's mean step plus this many standard deviations is an "
        "outlier", 0, source=f"{SAGEMAKER} StepOutlier: stddev"),
    "step_outlier_count": Threshold(
        10, "a rank with more outlier steps than this has step outliers", 0, integer=True,
        source=f"{SAGEMAKER} StepOutlier: n_outliers"),
    "step_outlier_min_steps": Threshold(
        101, "fewest steps (after warm-up) for the step-outlier rule to judge", 2, integer=True,
        source=f"{SAGEMAKER} StepOutlier: judges more than 100 steps"),
    "max_initialization_minutes": Threshold(
        20, "minutes from the start of a rank's process to its first step above which "
        "initialization is too long", 0, source=f"{SAGEMAKER} MaxInitializationTime: threshold"),
    "min_samples": Threshold(
        10, "fewest system samples (after warm-up) for the sample-based rules to judge a rank",
        1, integer=True),
    "gpu_memory_increase_pct": Threshold(
        5, "growth of GPU memory in use, in percent of the device's memory, from one window of "
        "samples to the next, above which GPU memory is increasing", 0, 100,
        source=f"{SAGEMAKER} GPUMemoryIncrease: increase"),
    "gpu_memory_window": Threshold(
        10, "samples per window of the GPU-memory-increase rule", 1, integer=True,
        source=f"{SAGEMAKER} GPUMemoryIncrease: window"),
    "io_wait_high_pct": Threshold(
        50, "machine CPU time waiting for I/O, in percent, above which a sample counts as "
        "waiting for I/O", 0, 100, source=f"{SAGEMAKER} IOBottleneck: io_threshold"),
    "io_gpu_low_pct": Threshold(
        10, "GPU utilization below which a sample waiting for I/O starves the GPU", 0, 100,
        source=f"{SAGEMAKER} IOBottleneck: gpu_threshold"),
    "io_bottleneck_fraction": Threshold(
        0.5, "fraction of a rank's samples that must be I/O bottlenecks (high I/O wait, idle GPU) "
        "for the rule to fire", 0, 1, source=f"{SAGEMAKER} IOBottleneck: threshold (50%)"),
    "load_balancing_distance": Threshold(
        0.5, "Jensen-Shannon distance between the utilization histograms of two GPUs of a host "
        "above which their load is unbalanced", 0, 1,
        source=f"{SAGEMAKER} LoadBalancing: threshold"),
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
                     + (f" (default from {t.source})" if t.source else "")
                     for name, t in THRESHOLDS.items())
