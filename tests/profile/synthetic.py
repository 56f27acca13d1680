"""Synthetic profiles for dtrain-report's tests: a run written exactly as dtrain::Profiler writes
it (Note [Profile schema]), with the step phases, samples and engine counts a test chooses.

The defaults describe a healthy GPU job: 98 ms steps that are mostly compute, a busy GPU with
most of its memory used, a machine with CPUs to spare, and small random jitter."""

from __future__ import annotations

import json
import random
from pathlib import Path

HEALTHY_PHASES = {"data": 2.0, "forward": 30.0, "backward": 55.0, "communication_wait": 6.0,
                  "optimizer": 4.0}
GPU_MEMORY = 80e9


def healthy_phases(rank: int, step: int) -> dict[str, float]:
    return dict(HEALTHY_PHASES)


def healthy_gpu(rank: int, t: float) -> dict | None:
    return {"utilization_pct": 93.0, "memory_utilization_pct": 40.0,
            "memory_used_bytes": 0.7 * GPU_MEMORY, "memory_total_bytes": GPU_MEMORY}


def healthy_system(rank: int, t: float) -> dict:
    return {"process_cpu_pct": 150.0, "system_cpu_pct": 45.0, "system_iowait_pct": 1.0,
            "procs_running": 6,
            "involuntary_switches_per_s": 3.0, "rss_bytes": 6e9, "threads": 12,
            "net_rx_bytes_per_s": 2e8, "net_tx_bytes_per_s": 2e8,
            "disk_read_bytes_per_s": 1e6, "disk_write_bytes_per_s": 0.0}


def healthy_engine(rank: int, step: int, phases: dict) -> dict:
    return {"collectives": 2, "bytes_reduced": 4.6e7}


HEALTHY_ENGINE_COUNTERS = ("collectives", "bytes_reduced")


def write_run(folder: Path, ranks: int = 4, steps: int = 40, phases=healthy_phases,
              gpu=healthy_gpu, system=healthy_system, host=lambda rank: "node0",
              cpu_count: int = 16, jitter: float = 0.03, batch: int = 64, run_id: str = "run-1",
              seed: int = 7, closed: bool = True, engine=healthy_engine, gpu_index=lambda r: r,
              header=None, sample_engine=None, first_step_t: float = 0.01,
              other=lambda rank, step: 1.0, engine_counters=HEALTHY_ENGINE_COUNTERS) -> Path:
    """Writes rank-<r>.jsonl for every rank; `gpu` returning None (or gpu=None) means no GPU.
    `engine(rank, step, phases)` gives a step's engine counters, `sample_engine(rank, t)` a
    sample's (None: none), `engine_counters` the header's list of the counters the dtrain that
    wrote it records, `header(rank)` fields added to the header, `other(rank, step)` the
    milliseconds of a step outside its phases."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for r in range(ranks):
        lines = [{
            "type": "header", "format": "dtrain-profile", "version": 1, "run_id": run_id,
            "rank": r, "size": ranks, "local_rank": r, "local_size": ranks, "host": host(r),
            "pid": 1000 + r, "cpu_count": cpu_count, "affinity_cpus": cpu_count,
            "sample_interval_ms": 500, "start_unix_ms": 1.7e12, "dtrain_version": "0.1.0",
            "gpu": ({"available": True, "index": gpu_index(r), "name": "Test GPU",
                     "memory_total_bytes": GPU_MEMORY} if gpu is not None and gpu(r, 0.0)
                    else {"available": False, "reason": "NVML not loaded (test)"}),
            "engine_counters": list(engine_counters)}]
        if header:
            lines[0].update(header(r))
        lines.append({"type": "start", "t": 0.0, "step": 0})
        t = first_step_t
        for i in range(steps):
            p = {k: v * (1 + rng.uniform(-jitter, jitter)) for k, v in phases(r, i).items()}
            other_ms = other(r, i)
            duration = sum(p.values()) + other_ms
            lines.append({"type": "step", "step": i, "t": round(t, 6), "duration_ms": duration,
                          "samples": batch, "phases_ms": p, "other_ms": other_ms,
                          "engine": engine(r, i, p)})
            t += duration / 1e3
        end = max(t, 2.0)
        k = 0.5
        while k < end:
            s = {"type": "sample", "t": k, **system(r, k)}
            g = gpu(r, k) if gpu is not None else None
            if g:
                s["gpu"] = g
            e = sample_engine(r, k) if sample_engine else None
            if e:
                s["engine"] = e
            lines.append(s)
            k += 0.5
        lines.append({"type": "stop", "t": end, "steps": steps, "phases_outside_steps": 0})
        if closed:
            lines.append({"type": "end", "t": end})
        (folder / f"rank-{r}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return folder
