"""The rules: each looks at the analysis and says whether its problem is there ("fired"), not
there ("quiet"), or cannot be judged from what was recorded ("not evaluated"), with the numbers,
ranks and steps behind the verdict and what to do about it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .analysis import COMPUTE_PHASES, Analysis, RankSummary, human_bytes, mean, median, \
    percentile, share, step_range

FIRED, QUIET, NOT_EVALUATED = "fired", "quiet", "not evaluated"


@dataclass
class Finding:
    rule: str
    title: str
    status: str
    summary: str
    evidence: list[str] = field(default_factory=list)
    suggestion: str = ""
    ranks: list[int] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)


def _ranks(rs) -> str:
    rs = list(rs)
    return ("rank " if len(rs) == 1 else "ranks ") + ", ".join(str(r) for r in rs)


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def _ms(x: float) -> str:
    return f"{x:.3g} ms" if x < 100 else f"{x:.0f} ms"


def _judged(a: Analysis) -> list[RankSummary]:
    """Ranks with enough steps for the step-based rules."""
    return [s for s in a.ranks.values() if len(s.steps) >= a.thresholds["min_steps"]]


def _too_few_steps(a: Analysis, rule: str, title: str) -> Finding:
    n = max((len(s.steps) for s in a.ranks.values()), default=0)
    return Finding(rule, title, NOT_EVALUATED,
                   f"too few steps: {n} after the {int(a.thresholds['warmup_steps'])} warm-up "
                   f"step(s), {int(a.thresholds['min_steps'])} needed (threshold min_steps)")


def _gpu_reason(a: Analysis) -> str:
    for s in a.ranks.values():
        g = s.profile.gpu
        if not g.get("available"):
            return str(g.get("reason") or "no GPU")
    return "the profile has no GPU samples"


def _dominant_wait(a: Analysis, ranks: list[int]) -> tuple[str, float]:
    """The non-compute part of the step (data, communication wait, other) that is largest."""
    best, best_share = "other", -1.0
    for name in ("data", "communication_wait", "other"):
        sh = mean(a.ranks[r].median_share.get(name, 0.0) for r in ranks)
        if sh > best_share:
            best, best_share = name, sh
    return best, best_share


def low_gpu_utilization(a: Analysis) -> Finding:
    rule, title = "low_gpu_utilization", "Low GPU utilization"
    if not a.has_gpu:
        return Finding(rule, title, NOT_EVALUATED, f"no GPU samples ({_gpu_reason(a)})")
    limit = a.thresholds["gpu_utilization_low_pct"]
    with_gpu = [s for s in a.ranks.values() if s.gpu_utilization]
    low = [s for s in with_gpu if median(s.gpu_utilization) < limit]
    if not low:
        worst = min(with_gpu, key=lambda s: median(s.gpu_utilization))
        return Finding(rule, title, QUIET,
                       f"median GPU utilization is {limit:g}% or more on every rank with a GPU "
                       f"(lowest: rank {worst.rank} at {median(worst.gpu_utilization):.0f}%)")
    evidence = []
    for s in low:
        g = s.profile.gpu
        ts = [x["t"] for x in s.profile.samples if isinstance(x.get("gpu"), dict)]
        evidence.append(
            f"rank {s.rank} (host {s.host}, GPU {g.get('index', '?')} {g.get('name', '')}): median "
            f"{median(s.gpu_utilization):.0f}%, 90th percentile "
            f"{percentile(s.gpu_utilization, 0.9):.0f}%, over {len(s.gpu_utilization)} samples "
            f"from {min(ts):.1f} s to {max(ts):.1f} s")
    wait, wait_share = _dominant_wait(a, [s.rank for s in low])
    if wait == "data":
        advice = (f"The steps spend a median {_pct(wait_share)} in the data phase: the GPU waits "
                  f"for input (see 'Data-loader bound').")
    elif wait == "communication_wait":
        advice = (f"The steps spend a median {_pct(wait_share)} waiting for communication (see "
                  f"'Communication bound' and 'Straggler rank').")
    else:
        advice = (f"{_pct(wait_share)} of a step is outside the phases marked in the program; mark "
                  f"more of the step with profiler phases to see where it goes.")
    return Finding(
        rule, title, FIRED,
        f"GPU utilization is below {limit:g}% on {_ranks(s.rank for s in low)}",
        evidence,
        advice + " If the GPU is idle with memory to spare, see 'Batch too small for the device'; "
        "otherwise give it more work per step or overlap input and communication with compute.",
        ranks=[s.rank for s in low])


def data_loader_bound(a: Analysis) -> Finding:
    rule, title = "data_loader_bound", "Data-loader bound"
    if "data" not in a.has_phase:
        return Finding(rule, title, NOT_EVALUATED,
                       "no data phase recorded: wrap loading the next batch in "
                       "profiler.phase(dtrain::Phase::data)")
    judged = _judged(a)
    if not judged:
        return _too_few_steps(a, rule, title)
    limit = a.thresholds["data_share_high"]
    bound = [s for s in judged if s.median_share.get("data", 0.0) >= limit]
    if not bound:
        top = max(judged, key=lambda s: s.median_share.get("data", 0.0))
        return Finding(rule, title, QUIET,
                       f"the data phase takes a median {_pct(top.median_share.get('data', 0.0))} "
                       f"of a step at most (rank {top.rank}), under {_pct(limit)}")
    evidence, steps = [], set()
    for s in bound:
        slow = [st for st in s.steps if share(st.phase("data"), st.duration_ms) >= limit]
        steps.update(st.index for st in slow)
        worst = sorted(s.steps, key=lambda st: -st.phase("data"))[:3]
        line = (f"rank {s.rank} (host {s.host}): data takes a median "
                f"{_ms(median(st.phase('data') for st in s.steps))} of a "
                f"{_ms(s.median_step_ms)} step ({_pct(s.median_share['data'])}); "
                f"{_pct(len(slow) / len(s.steps))} of steps {step_range([st.index for st in s.steps])} "
                f"are above {_pct(limit)}; longest: "
                + ", ".join(f"step {st.index} ({_ms(st.phase('data'))})" for st in worst))
        if "disk_read_bytes_per_s" in s.cpu:
            line += f"; disk reads a median {human_bytes(s.cpu['disk_read_bytes_per_s'])}/s"
        evidence.append(line)
    return Finding(
        rule, title, FIRED,
        f"{_ranks(s.rank for s in bound)} spend{'s' if len(bound) == 1 else ''} "
        f"{_pct(limit)} or more of each step waiting for data",
        evidence,
        "Prepare the next batch while the current one trains: a loader thread or prefetch queue "
        "(libtorch's DataLoader with workers), decode once and cache, keep the data set on fast "
        "local storage, and make each rank read only its own shard (DistributedSampler).",
        ranks=[s.rank for s in bound], steps=sorted(steps))


def _engine_evidence(s: RankSummary, comm_ms: float) -> str:
    e = s.engine_mean
    if not e:
        return ""
    parts = []
    if "collectives" in e:
        parts.append(f"{e['collectives']:.3g} collectives")
    if "bytes_reduced" in e:
        parts.append(f"{human_bytes(e['bytes_reduced'])} reduced")
        if comm_ms > 0 and e["bytes_reduced"] > 0:
            parts.append(f"{human_bytes(e['bytes_reduced'] / (comm_ms / 1e3))}/s over the wait")
    if "negotiation_ns" in e:
        parts.append(f"{_ms(e['negotiation_ns'] / 1e6)} negotiating")
    if "wait_for_slowest_ns" in e:
        if e["wait_for_slowest_ns"] > 0:  # recorded by rank 0
            parts.append(f"{_ms(e['wait_for_slowest_ns'] / 1e6)} waiting for the slowest rank")
    return "; per step the engine ran " + ", ".join(parts) if parts else ""


def communication_bound(a: Analysis) -> Finding:
    rule, title = "communication_bound", "Communication bound"
    if "communication_wait" not in a.has_phase:
        return Finding(rule, title, NOT_EVALUATED,
                       "no communication_wait phase recorded: wrap the wait for gradients "
                       "(DistributedOptimizer::synchronize(), Handle::wait()) in "
                       "profiler.phase(dtrain::Phase::communication_wait)")
    judged = _judged(a)
    if not judged:
        return _too_few_steps(a, rule, title)
    limit = a.thresholds["communication_share_high"]
    shares = {s.rank: s.median_share.get("communication_wait", 0.0) for s in judged}
    least = min(judged, key=lambda s: shares[s.rank])
    if shares[least.rank] < limit:
        high = [r for r, sh in shares.items() if sh >= limit]
        extra = (f"; {_ranks(high)} wait{'s' if len(high) == 1 else ''} longer, for a slower rank "
                 f"(see 'Straggler rank')" if high else "")
        return Finding(rule, title, QUIET,
                       f"rank {least.rank} waits a median {_pct(shares[least.rank])} of a step "
                       f"for communication, under {_pct(limit)}{extra}")
    evidence = []
    for s in judged:
        comm = median(st.phase("communication_wait") for st in s.steps)
        evidence.append(f"rank {s.rank}: a median {_ms(comm)} of a {_ms(s.median_step_ms)} step "
                        f"({_pct(shares[s.rank])}) waiting for communication over steps "
                        f"{step_range([st.index for st in s.steps])}"
                        + _engine_evidence(s, comm))
    e = least.engine_mean
    small_ops = e and e.get("collectives", 0) >= 4 and \
        e.get("bytes_reduced", 0) / max(e.get("collectives", 1), 1) < (1 << 20)
    advice = ("Many small collectives per step: latency, not bandwidth, is the cost; let the "
              "engine fuse them (DTRAIN_FUSION_THRESHOLD, DTRAIN_CYCLE_TIME) or submit them as one "
              "grouped_allreduce. " if small_ops else "")
    advice += ("Overlap communication with compute: submit each gradient as backward produces it "
               "(the libtorch DistributedOptimizer does this with hooks) so that only the tail is "
               "waited for; halve the bytes with Compression::fp16 or bf16; across hosts try "
               "DTRAIN_HIERARCHICAL_ALLREDUCE=1; a larger batch per rank does more work per byte "
               "exchanged.")
    return Finding(
        rule, title, FIRED,
        f"even the rank that waits least (rank {least.rank}) spends a median "
        f"{_pct(shares[least.rank])} of each step waiting for communication",
        evidence, advice, ranks=sorted(shares), steps=a.common_steps)


def straggler_rank(a: Analysis) -> Finding:
    rule, title = "straggler_rank", "Straggler rank"
    if len(a.ranks) < 2:
        return Finding(rule, title, NOT_EVALUATED, "one rank: nobody to be slower than")
    if "communication_wait" not in a.has_phase:
        return Finding(rule, title, NOT_EVALUATED,
                       "no communication_wait phase recorded: it separates a rank's own work from "
                       "waiting for the others (synchronous steps take equally long everywhere)")
    steps = a.common_steps
    if len(steps) < a.thresholds["min_steps"]:
        return Finding(rule, title, NOT_EVALUATED,
                       f"{len(steps)} steps recorded by every rank after warm-up; "
                       f"{int(a.thresholds['min_steps'])} needed (threshold min_steps)")
    ranks = sorted(a.ranks)
    ratios = {r: [] for r in ranks}
    excess = {r: [] for r in ranks}
    slowest_in = {r: [] for r in ranks}
    for i in steps:
        busy = {r: a.step_of(r, i).busy_ms for r in ranks}
        slowest_in[max(ranks, key=lambda r: busy[r])].append(i)
        for r in ranks:
            others = median(busy[o] for o in ranks if o != r)
            ratios[r].append(busy[r] / others if others > 0 else math.inf)
            excess[r].append(busy[r] - others)
    t = a.thresholds
    stragglers = [r for r in ranks
                  if median(ratios[r]) >= t["straggler_slowdown"]
                  and median(excess[r]) >= t["straggler_min_ms"]
                  and len(slowest_in[r]) / len(steps) >= t["straggler_step_fraction"]]
    if not stragglers:
        worst = max(ranks, key=lambda r: median(ratios[r]))
        return Finding(rule, title, QUIET,
                       f"no rank is consistently slower: the largest median slowdown is rank "
                       f"{worst} at {median(ratios[worst]):.2f}x the others' own work per step "
                       f"(threshold {t['straggler_slowdown']:g}x)")
    evidence, advice_parts = [], []
    for r in stragglers:
        s = a.ranks[r]
        others = [o for o in ranks if o != r]
        own = median(a.step_of(r, i).busy_ms for i in steps)
        theirs = median(median(a.step_of(o, i).busy_ms for o in others) for i in steps)
        waited = median(median(a.step_of(o, i).phase("communication_wait") for o in others)
                        for i in steps)
        worst = sorted(zip(excess[r], steps), reverse=True)[:3]
        evidence.append(
            f"rank {r} (host {s.host}) is the slowest in {_pct(len(slowest_in[r]) / len(steps))} "
            f"of steps {step_range(steps)}: its own work takes a median {_ms(own)} per step "
            f"against the other ranks' {_ms(theirs)} (step by step, a median "
            f"{median(ratios[r]):.2f}x theirs); meanwhile they wait a median {_ms(waited)} per "
            f"step for communication; widest gaps: "
            + ", ".join(f"step {i} (+{_ms(d)})" for d, i in worst))
        diffs = {p: s.mean_phase_ms.get(p, 0.0) - mean(a.ranks[o].mean_phase_ms.get(p, 0.0)
                                                      for o in others)
                 for p in a.phase_names if p != "communication_wait"}
        phase, extra = max(diffs.items(), key=lambda kv: kv[1])
        evidence.append(f"rank {r}'s extra time is mostly in {phase} "
                        f"(+{_ms(extra)} per step on average)")
        if phase == "data":
            advice_parts.append(f"Rank {r} waits longer for its input: its shard may hold larger "
                                f"samples (balance them with SplitSortedBucketSampler) or its "
                                f"storage may be slower.")
        elif phase in COMPUTE_PHASES:
            advice_parts.append(f"Rank {r} computes more slowly: check host {s.host} for other "
                                f"load (see 'CPU oversubscribed'), throttling, or a slower device, "
                                f"and that every rank gets equally sized batches.")
        else:
            advice_parts.append(f"Rank {r} spends the extra time in '{phase}': profile that part "
                                f"of its step more finely.")
    return Finding(rule, title, FIRED,
                   f"{_ranks(stragglers)} {'holds' if len(stragglers) == 1 else 'hold'} the "
                   f"others back in most steps",
                   evidence, " ".join(advice_parts) + " Every rank waits for the slowest one at "
                   "each gradient exchange, so the job runs at its pace.",
                   ranks=stragglers, steps=sorted(set(i for r in stragglers for i in slowest_in[r])))


def batch_too_small(a: Analysis) -> Finding:
    rule, title = "batch_too_small", "Batch too small for the device"
    with_memory = [s for s in a.ranks.values() if s.gpu_utilization and s.gpu_memory_fraction]
    if not with_memory:
        return Finding(rule, title, NOT_EVALUATED,
                       f"needs GPU utilization and memory samples ({_gpu_reason(a)})")
    t = a.thresholds
    small = []
    for s in with_memory:
        busy_cpu = s.cpu.get("system_cpu_pct", 0.0) >= t["cpu_busy_pct"]
        data_bound = s.median_share.get("data", 0.0) >= t["data_share_high"]
        if (median(s.gpu_utilization) < t["gpu_utilization_low_pct"]
                and median(s.gpu_memory_fraction) < t["gpu_memory_low_fraction"]
                and not busy_cpu and not data_bound):
            small.append(s)
    if not small:
        return Finding(rule, title, QUIET,
                       "no rank has an idle GPU with most of its memory free and neither its CPU "
                       "nor its input as the limit")
    evidence = []
    for s in small:
        batch = median(st.samples for st in s.steps) if s.steps else math.nan
        total = s.profile.gpu.get("memory_total_bytes") or 0
        evidence.append(
            f"rank {s.rank}: GPU busy a median {median(s.gpu_utilization):.0f}% with "
            f"{_pct(median(s.gpu_memory_fraction))} of its {human_bytes(total)} memory in use"
            + (f"; batch {batch:.0f} per rank" if batch and not math.isnan(batch) else "")
            + f"; data {_pct(s.median_share.get('data', 0.0))} of a step; machine CPU "
              f"{s.cpu.get('system_cpu_pct', math.nan):.0f}%")
    return Finding(
        rule, title, FIRED,
        f"the GPU of {_ranks(s.rank for s in small)} is mostly idle with memory to spare",
        evidence,
        "Raise the batch per rank while memory allows (keep the global learning rate in step "
        "with LrSchedule's scaling and warmup, docs/data-and-schedules.md), or train on fewer GPUs "
        "with a larger batch each: fixed per-step costs (kernel launches, synchronization, "
        "gradient exchange) are then spread over more samples.",
        ranks=[s.rank for s in small])


def cpu_oversubscribed(a: Analysis) -> Finding:
    rule, title = "cpu_oversubscribed", "CPU oversubscribed"
    t = a.thresholds
    hosts = a.run.hosts
    evaluated, fired, evidence, quiet_notes = 0, [], [], []
    for host, ranks in hosts.items():
        summaries = [a.ranks[r] for r in ranks]
        cores = max(s.profile.cpu_count for s in summaries)
        system = [v for s in summaries for v in s.sampled("system_cpu_pct")]
        runnable = [v for s in summaries for v in s.sampled("procs_running")]
        if not cores or not system or not runnable:
            continue
        evaluated += 1
        busy, per_cpu = median(system), median(runnable) / cores
        if busy >= t["cpu_busy_pct"] and per_cpu > t["runnable_per_cpu"]:
            fired.extend(ranks)
            own = sum(s.cpu.get("process_cpu_pct", 0.0) for s in summaries)
            threads = [int(s.cpu["threads"]) for s in summaries if "threads" in s.cpu]
            switches = [f"rank {s.rank} {s.cpu['involuntary_switches_per_s']:.0f}/s"
                        for s in summaries if "involuntary_switches_per_s" in s.cpu]
            others = busy - own / cores
            evidence.append(
                f"host {host} ({cores} CPUs, {_ranks(ranks)}): CPUs a median {busy:.0f}% busy "
                f"with {per_cpu:.1f} runnable tasks per CPU; the ranks use {own / 100:.2f} CPUs "
                f"together ({own / cores:.0f}% of the machine"
                + (f", other programs about {others:.0f}%)" if others >= 10 else ")")
                + (f", with {sum(threads)} threads" if threads else "")
                + ("; preempted (involuntary context switches): " + ", ".join(switches)
                   if switches else ""))
        else:
            quiet_notes.append(f"host {host}: {busy:.0f}% busy, {per_cpu:.1f} runnable per CPU")
    if not evaluated:
        return Finding(rule, title, NOT_EVALUATED,
                       "no samples of machine CPU use and runnable tasks (/proc/stat unreadable?)")
    if not fired:
        return Finding(rule, title, QUIET,
                       "every host has a free CPU for each runnable task (" +
                       "; ".join(quiet_notes) + ")")
    return Finding(
        rule, title, FIRED,
        f"more tasks want to run than there are CPUs on the host(s) of {_ranks(fired)}",
        evidence,
        "Give each rank (CPUs per host / ranks per host) threads (torch::set_num_threads, "
        "OMP_NUM_THREADS; the ResNet example does this), start fewer ranks per host, or move other "
        "work off the host: when the ranks use much less than the busy share, another program is "
        "taking the CPUs.",
        ranks=sorted(fired))


RULES = (low_gpu_utilization, data_loader_bound, communication_bound, straggler_rank,
         batch_too_small, cpu_oversubscribed)


def evaluate(a: Analysis) -> list[Finding]:
    findings = [rule(a) for rule in RULES]
    by_rule = {f.rule: f for f in findings}
    # A host short of CPU slows everything on it, the exchanges included: say so where the
    # communication finding's reader will look first.
    comm, cpu = by_rule["communication_bound"], by_rule["cpu_oversubscribed"]
    if comm.status == FIRED and cpu.status == FIRED:
        comm.suggestion = (f"First see 'CPU oversubscribed': {_ranks(cpu.ranks)} share "
                           f"oversubscribed CPUs, which delays every exchange (a rank that is not "
                           f"running cannot answer its peers). " + comm.suggestion)
    return findings
