"""The rules: each looks at the analysis and says whether its problem is there ("fired"), not
there ("quiet"), or cannot be judged from what was recorded ("not evaluated"), with the numbers,
ranks and steps behind the verdict and what to do about it. One rule only summarizes
("summary": the system's usage) and never fires."""

from __future__ import annotations

import bisect
import collections
import math
from dataclasses import dataclass, field

from .analysis import COMPUTE_PHASES, EXECUTION_COUNTER, Analysis, RankSummary, devices, \
    human_bytes, is_number, mean, median, percentile, share, step_range, system_usage

FIRED, QUIET, NOT_EVALUATED, SUMMARY = "fired", "quiet", "not evaluated", "summary"
IOWAIT_FIELD = "system_iowait_pct"


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


def _duration(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


def score_evidence(a: Analysis) -> list[str]:
    """The straggler scores' verdict per rank that fell under the threshold in some interval."""
    if not a.scores:
        return []
    low = a.thresholds["straggler_score_low"]
    out = []
    for r in sorted(a.ranks):
        under = [iv for iv in a.scores if r in iv.low]
        if under:
            out.append(f"rank {r}'s straggler score (the fastest rank's median own work per "
                       f"step over its own) is under {low:g} in {len(under)} of "
                       f"{len(a.scores)} intervals of steps, lowest "
                       f"{min(iv.scores[r] for iv in under):.2f} (steps "
                       f"{step_range([i for iv in under for i in iv.steps])})")
    return out


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
        b = s.breakdown
        lower_bound = b.overlap_source == "collective_ns"
        # A lower bound of 0 says nothing: leave it out.
        hidden = "" if math.isnan(b.overlap) or (lower_bound and b.overlap < 0.005) else (
            f"; {'at least ' if lower_bound else ''}"
            f"{_pct(b.overlap)} of its communication time overlaps the rest of the step")
        evidence.append(f"rank {s.rank}: a median {_ms(comm)} of a {_ms(s.median_step_ms)} step "
                        f"({_pct(shares[s.rank])}) waiting for communication over steps "
                        f"{step_range([st.index for st in s.steps])}"
                        + _engine_evidence(s, comm) + hidden)
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


def _median_without(ordered: list[float], value: float) -> float:
    """The median of the sorted `ordered` without one occurrence of `value`: median() of the
    other ranks' values, without sorting them again for every rank."""
    k = bisect.bisect_left(ordered, value)
    n = len(ordered) - 1

    def at(j: int) -> float:
        return ordered[j if j < k else j + 1]
    if n == 0:
        return math.nan
    return at(n // 2) if n % 2 else 0.5 * (at(n // 2 - 1) + at(n // 2))


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
        ordered = sorted(busy.values())
        for r in ranks:
            others = _median_without(ordered, busy[r])
            ratios[r].append(busy[r] / others if others > 0 else math.inf)
            excess[r].append(busy[r] - others)
    t = a.thresholds
    stragglers = [r for r in ranks
                  if median(ratios[r]) >= t["straggler_slowdown"]
                  and median(excess[r]) >= t["straggler_min_ms"]
                  and len(slowest_in[r]) / len(steps) >= t["straggler_step_fraction"]]
    if not stragglers:
        worst = max(ranks, key=lambda r: median(ratios[r]))
        scored = score_evidence(a)
        return Finding(rule, title, QUIET,
                       f"no rank is consistently slower: the largest median slowdown is rank "
                       f"{worst} at {median(ratios[worst]):.2f}x the others' own work per step "
                       f"(threshold {t['straggler_slowdown']:g}x)"
                       + ("; but the straggler scores name a rank in some intervals" if scored
                          else ""), scored)
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
        if phase == "other" and not a.compute_marked:
            evidence.append(f"rank {r}'s extra time is in its own work between the exchanges "
                            f"(+{_ms(extra)} per step on average), which the program does not "
                            f"break into phases")
        else:
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
        elif phase == "other" and not a.compute_marked:
            advice_parts.append(f"Rank {r} works more slowly between the exchanges: mark its "
                                f"data, forward and backward phases to see which; meanwhile "
                                f"check host {s.host} for other load and every rank's batch.")
        else:
            advice_parts.append(f"Rank {r} spends the extra time in '{phase}': profile that part "
                                f"of its step more finely.")
    evidence += score_evidence(a)
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


ENGINE_CPU_COUNTER = "engine_cpu_ns"
WAIT_COUNTERS = {ENGINE_CPU_COUNTER: "the engine thread's CPU time",
                 EXECUTION_COUNTER: "the engine's time executing collectives"}


def _records_counter(s: RankSummary, name: str) -> bool:
    """Whether the rank's dtrain records the engine counter `name`. Steps leave out counters that
    did not move, so the header's engine_counters, which names every counter recorded, decides;
    a step that carries the counter settles it for a header without that list."""
    listed = s.profile.header.get("engine_counters")
    if isinstance(listed, list) and name in listed:
        return True
    return any(st.engine and name in st.engine for st in s.profile.steps)


@dataclass
class _EngineWait:
    """A rank's engine thread over its judged steps, summed: a collective's time is counted in
    the step in which it ends and its CPU in the steps in which it ran, so single steps disagree
    where their sums do not."""
    summary: RankSummary
    cpu_ms: float
    collective_ms: float
    step_ms: float

    @property
    def cores(self) -> float:
        """The engine's CPU per unit of its time in collectives: 1 for a thread that polls
        throughout. The engine's little CPU outside collectives (negotiation, whose waits sleep:
        Note [Waiting without burning cores]) is counted too, so this errs slightly high."""
        return self.cpu_ms / self.collective_ms

    @property
    def collective_share(self) -> float:
        return share(self.collective_ms, self.step_ms)

    @property
    def cpu_share(self) -> float:
        return share(self.cpu_ms, self.step_ms)

    def per_step(self, ms: float) -> float:
        return ms / len(self.summary.steps)


def _engine_wait(s: RankSummary) -> _EngineWait:
    engines = [st.engine or {} for st in s.steps]
    return _EngineWait(summary=s,
                       cpu_ms=sum(e.get(ENGINE_CPU_COUNTER, 0.0) for e in engines) / 1e6,
                       collective_ms=sum(e.get(EXECUTION_COUNTER, 0.0) for e in engines) / 1e6,
                       step_ms=sum(st.duration_ms for st in s.steps))


def engine_busy_wait(a: Analysis) -> Finding:
    """The engine thread's CPU time per unit of its time executing collectives says how it waits
    for its peers (Note [Engine CPU time] in runtime/engine/thread_cpu_clock.hpp): a thread that polls MPI uses a
    core for the whole collective, one that sleeps between tests little beyond the collective's
    own work. collective_ns is the denominator because it is the engine thread's own wall time
    in collectives; negotiation_ns is summed over ops that overlap, nobody's wall time."""
    rule, title = "engine_busy_wait", "Engine busy-waiting"
    hosts = a.run.hosts
    if len(hosts) < 2:
        # Within a host MPI moves the bytes through shared memory only while it is polled, so
        # the engine waits hot there on purpose (Note [Waiting for data collectives]).
        return Finding(rule, title, QUIET,
                       f"one host: shared-memory waits poll by design (host {next(iter(hosts))}: "
                       f"MPI moves the bytes within a host only while it is polled, so the "
                       f"engine's CPU while it waits is expected)")
    missing = [c for c in WAIT_COUNTERS if not any(_records_counter(s, c)
                                                   for s in a.ranks.values())]
    if missing:
        return Finding(rule, title, NOT_EVALUATED,
                       "; ".join(f"{WAIT_COUNTERS[c]} ({c}) is not among the profile's engine "
                                 f"counters" for c in missing)
                       + ": it was written by a dtrain that does not record "
                       + ("it" if len(missing) == 1 else "them"))
    recorded = [s for s in _judged(a) if all(_records_counter(s, c) for c in WAIT_COUNTERS)]
    if not recorded:
        return _too_few_steps(a, rule, title)
    waits = [w for w in map(_engine_wait, recorded) if w.collective_ms > 0]
    if not waits:
        return Finding(rule, title, QUIET,
                       f"the engine executed no collectives in the judged steps of "
                       f"{_ranks(s.rank for s in recorded)}: it had nothing to wait for")
    t = a.thresholds
    cores_limit, share_limit = t["engine_wait_cores"], t["engine_wait_share"]
    fired = [w for w in waits if w.cores >= cores_limit and w.collective_share >= share_limit]
    if not fired:
        # The rank nearest to firing: among those whose collectives take enough of the step, the
        # one that burns the most.
        candidates = [w for w in waits if w.collective_share >= share_limit] or waits
        most = max(candidates, key=lambda w: w.cores)
        return Finding(rule, title, QUIET,
                       f"no rank's engine thread uses {cores_limit:g} core or more while "
                       f"collectives take {_pct(share_limit)} or more of its step (most: rank "
                       f"{most.summary.rank} at {most.cores:.2f} cores in collectives that take "
                       f"{_pct(most.collective_share)} of its step; thresholds engine_wait_cores "
                       f"and engine_wait_share)")
    evidence = []
    for w in fired:
        s = w.summary
        evidence.append(
            f"rank {s.rank} (host {s.host}): its engine thread used {w.cores:.2f} cores while "
            f"executing collectives over steps {step_range([st.index for st in s.steps])}: "
            f"{_ms(w.per_step(w.cpu_ms))} of CPU per step against "
            f"{_ms(w.per_step(w.collective_ms))} in collectives, which take "
            f"{_pct(w.collective_share)} of a {_ms(w.per_step(w.step_ms))} step; the engine's "
            f"CPU is {_pct(w.cpu_share)} of the step's time")
    ranks = [w.summary.rank for w in fired]
    lowest, highest = min(w.cores for w in fired), max(w.cores for w in fired)
    cores = f"{lowest:.2f}" if f"{lowest:.2f}" == f"{highest:.2f}" else \
        f"{lowest:.2f} to {highest:.2f}"
    return Finding(
        rule, title, FIRED,
        f"the engine thread of {_ranks(ranks)} polls while it waits for collectives across "
        f"{len(hosts)} hosts: it uses {cores} cores during them",
        evidence,
        "The engine waits for its peers by polling, which takes a core from the work beside it "
        "(backward, on a CPU cluster). Across hosts dtrain posts its collectives in their "
        "nonblocking form and sleeps between tests while the data crosses the link (Note "
        "[Waiting for data collectives] in comm/request_wait.hpp). Check that "
        "DTRAIN_WAIT_MAX_SLEEP_US is not 0 (0 never sleeps; the default is 500); that the ranks "
        "are on separate hosts as intended (within a host the waits poll by design); and that "
        "MPI is not set to spin (MPICH's MPIR_CVAR_ASYNC_PROGRESS=1 adds a progress thread that "
        "polls). With DTRAIN_HIERARCHICAL_ALLREDUCE=1 the steps within each host poll by design "
        "and only the step across hosts sleeps. On a fast network the collective's own work "
        "(packing the fusion buffer, adding the pieces) is CPU too: where the waits already "
        "sleep, that is what the figure counts.",
        ranks=ranks, steps=sorted({st.index for w in fired for st in w.summary.steps}))


def _no_steps(rule: str, title: str) -> Finding:
    return Finding(rule, title, NOT_EVALUATED, "no steps seen: the rule judges step times")


def _phase_of_extra_time(a: Analysis, s: RankSummary, picked) -> tuple[str, float]:
    """The phase (or "other") that grew most in the steps picked, against the rank's median."""
    best, best_extra = "other", -math.inf
    for name in a.phase_names:
        def value(st):
            return st.other_ms if name == "other" else st.phase(name)
        extra = median(value(st) for st in picked) - median(value(st) for st in s.steps)
        if extra > best_extra:
            best, best_extra = name, extra
    return best, best_extra


def step_outlier(a: Analysis) -> Finding:
    rule, title = "step_outlier", "Step outliers"
    if not a.run.has_steps:
        return _no_steps(rule, title)
    t = a.thresholds
    need = int(t["step_outlier_min_steps"])
    judged = [s for s in a.ranks.values() if len(s.steps) >= need]
    if not judged:
        n = max(len(s.steps) for s in a.ranks.values())
        return Finding(rule, title, NOT_EVALUATED,
                       f"too few steps: {n} after warm-up, {need} needed for a standard deviation "
                       f"to mean something (threshold step_outlier_min_steps)")
    found, counts = [], {}
    for s in judged:
        durations = [st.duration_ms for st in s.steps]
        mu = mean(durations)
        sigma = math.sqrt(mean((d - mu) ** 2 for d in durations))
        limit = mu + t["step_outlier_stddev"] * sigma
        outliers = [st for st in s.steps if st.duration_ms > limit]
        counts[s.rank] = len(outliers)
        if len(outliers) > t["step_outlier_count"]:
            found.append((s, mu, sigma, limit, outliers))
    if not found:
        most = max(counts, key=lambda r: counts[r])
        return Finding(rule, title, QUIET,
                       f"no rank has more than {int(t['step_outlier_count'])} steps longer than "
                       f"its mean + {t['step_outlier_stddev']:g} standard deviations (most: rank "
                       f"{most} with {counts[most]})")
    evidence, advice, steps = [], [], set()
    for s, mu, sigma, limit, outliers in found:
        steps.update(st.index for st in outliers)
        longest = sorted(outliers, key=lambda st: -st.duration_ms)[:3]
        phase, extra = _phase_of_extra_time(a, s, outliers)
        line = (f"rank {s.rank}: {len(outliers)} of {len(s.steps)} steps took longer than "
                f"{_ms(limit)} (its mean {_ms(mu)} + {t['step_outlier_stddev']:g} x "
                f"{_ms(sigma)}): steps {step_range([st.index for st in outliers])}; longest: "
                + ", ".join(f"step {st.index} ({_ms(st.duration_ms)})" for st in longest)
                + f"; in them {phase} takes a median {_ms(extra)} more than in the rank's "
                  f"median step")
        if phase == "communication_wait" and len(a.ranks) > 1:
            slowest = [max(a.ranks, key=lambda r: a.step_of(r, st.index).busy_ms)
                       for st in outliers if all(a.step_of(r, st.index) for r in a.ranks)]
            if slowest:
                counts = collections.Counter(slowest)
                culprit = max(set(slowest), key=counts.__getitem__)
                line += (f"; rank {culprit}'s own work was the longest in "
                         f"{counts[culprit]} of those {len(outliers)} steps")
        evidence.append(line)
        if phase == "data":
            advice.append(f"Rank {s.rank}'s input stalls now and then: a loader queue that runs "
                          f"dry, files that miss the page cache, shared storage under load; "
                          f"prefetch further ahead.")
        elif phase == "communication_wait":
            advice.append(f"Rank {s.rank} waits for the others in those steps: a rank that is "
                          f"slow now and then (see 'Straggler rank' and the scores) or a network "
                          f"shared with other jobs.")
        elif phase in COMPUTE_PHASES:
            advice.append(f"Rank {s.rank}'s {phase} is slow now and then: memory allocation (a "
                          f"cache that is flushed), garbage collection, other programs on host "
                          f"{s.host}, or inputs of varying size.")
        elif phase == "other":
            advice.append(f"Rank {s.rank}'s extra time is outside the marked phases: mark more of "
                          f"the step to see where it goes.")
        else:
            advice.append(f"Rank {s.rank}'s '{phase}' phase is long now and then: when it is "
                          f"periodic work (checkpoints, evaluation, logging), run it in the "
                          f"background or between steps.")
    return Finding(rule, title, FIRED,
                   f"{_ranks(s.rank for s, *_ in found)} "
                   f"{'has' if len(found) == 1 else 'have'} more than "
                   f"{int(t['step_outlier_count'])} steps longer than the mean + "
                   f"{t['step_outlier_stddev']:g} standard deviations",
                   evidence, " ".join(advice), ranks=[s.rank for s, *_ in found],
                   steps=sorted(steps))


def max_initialization_time(a: Analysis) -> Finding:
    rule, title = "max_initialization_time", "Initialization time"
    limit_min = a.thresholds["max_initialization_minutes"]
    limit = limit_min * 60
    measured, waited, unknown = {}, {}, []
    for r, s in a.ranks.items():
        uptime = s.profile.header.get("process_uptime_ms")
        before = uptime / 1e3 if is_number(uptime) else None
        if s.profile.steps and s.profile.recorded_from_first_step \
                and s.profile.steps[0].index == 0:
            measured[r] = (before, s.profile.steps[0].t)
        elif not s.profile.steps:
            waited[r] = (before, s.profile.last_t)
        else:
            unknown.append(r)

    def total(pair):
        return (pair[0] or 0.0) + pair[1]

    def when(pair):
        before, after = pair
        if before is None:
            return (f"{_duration(total(pair))} after profiling began (the process's start-up "
                    f"before that is not recorded)")
        return (f"{_duration(total(pair))} after the process started ({_duration(before)} "
                f"before profiling began, {_duration(after)} after)")
    slow = {r: p for r, p in measured.items() if total(p) > limit}
    stuck = {r: p for r, p in waited.items() if total(p) > limit}
    if slow or stuck:
        evidence = [f"rank {r} (host {a.ranks[r].host}): its first step began {when(p)}"
                    for r, p in sorted(slow.items())]
        evidence += [f"rank {r} (host {a.ranks[r].host}): no step had begun {when(p)}, where its "
                     f"profile ends" for r, p in sorted(stuck.items())]
        return Finding(
            rule, title, FIRED,
            f"{_ranks(sorted(slow) + sorted(stuck))} took more than {limit_min:g} min to reach "
            f"the first training step",
            evidence,
            "Start-up work that every rank repeats is the usual cause: downloading, unpacking or "
            "indexing the data set (do it once, keep it on local disk), loading a checkpoint on "
            "every rank (one rank reads and broadcasts, dtrain::Checkpoint does), compiling or "
            "tuning kernels, or one host that starts late (the others wait for it in "
            "dtrain::init()). A program that never runs a training step (no profiler.step() or "
            "DistributedOptimizer::step()) can ignore this finding.",
            ranks=sorted(slow) + sorted(stuck))
    if measured:
        worst = max(measured, key=lambda r: total(measured[r]))
        return Finding(rule, title, QUIET,
                       f"the first step began within {limit_min:g} min on every rank that "
                       f"recorded it (latest: rank {worst}, {when(measured[worst])})")
    if unknown:
        return Finding(rule, title, NOT_EVALUATED,
                       f"recording began after the first step on {_ranks(unknown)} "
                       f"(ProfilerOptions::start_recording = false), so the time to it is not "
                       f"known")
    longest = max(total(p) for p in waited.values()) if waited else 0.0
    return Finding(rule, title, NOT_EVALUATED,
                   f"no steps seen in the {_duration(longest)} recorded, under the "
                   f"{limit_min:g} min threshold")


def gpu_memory_increase(a: Analysis) -> Finding:
    rule, title = "gpu_memory_increase", "GPU memory increase"
    gpus = devices(a)
    if not gpus:
        return Finding(rule, title, NOT_EVALUATED, f"no GPU samples ({_gpu_reason(a)})")
    t = a.thresholds
    w = int(t["gpu_memory_window"])
    need = max(int(t["min_samples"]), 2 * w)
    growth, evidence, fired, short = {}, [], [], []
    for (host, index), ranks in gpus.items():
        s = a.ranks[ranks[0]]
        series = s.gpu_series("memory_pct", s.judged_samples)
        if len(series) < need:
            short.append(f"GPU {index} of host {host}: {len(series)} samples")
            continue
        v = [x for _, x in series]
        best, at = -math.inf, 0
        for i in range(2 * w, len(v) + 1):
            rise = mean(v[i - w:i]) - mean(v[i - 2 * w:i - w])
            if rise > best:
                best, at = rise, i
        growth[(host, index)] = best
        if best > t["gpu_memory_increase_pct"]:
            fired.extend(ranks)
            total = s.profile.gpu.get("memory_total_bytes")
            size = f" of its {human_bytes(total)}" if is_number(total) else ""
            evidence.append(
                f"GPU {index} of host {host} ({_ranks(ranks)}): memory in use grew by "
                f"{best:.1f}% of the device{size} from the {w} samples ending at "
                f"{series[at - w - 1][0]:.1f} s (a mean of {mean(v[at - 2 * w:at - w]):.1f}%) to "
                f"the {w} ending at {series[at - 1][0]:.1f} s ({mean(v[at - w:at]):.1f}%); "
                f"{v[0]:.0f}% at {series[0][0]:.1f} s, {v[-1]:.0f}% at {series[-1][0]:.1f} s, "
                f"peak {max(v):.0f}%")
    if not growth:
        return Finding(rule, title, NOT_EVALUATED,
                       f"too few GPU memory samples after warm-up ({'; '.join(short)}; "
                       f"{need} needed: two windows of gpu_memory_window and min_samples)")
    if not fired:
        (host, index), most = max(growth.items(), key=lambda kv: kv[1])
        return Finding(rule, title, QUIET,
                       f"GPU memory in use grows by at most {max(most, 0):.1f}% of the device "
                       f"from one window of {w} samples to the next (GPU {index} of host "
                       f"{host}; threshold {t['gpu_memory_increase_pct']:g}%)")
    return Finding(
        rule, title, FIRED,
        f"GPU memory in use keeps growing on {_ranks(sorted(fired))}", evidence,
        "Memory that grows during training ends in an out-of-memory error. Look for tensors "
        "kept from step to step (a running loss summed as a tensor instead of loss.item(), "
        "outputs or activations stored for later), caches that grow with each new input shape "
        "(variable-size batches: pad or bucket them, SplitSortedBucketSampler), and memory an "
        "evaluation or checkpoint step allocates and keeps.",
        ranks=sorted(fired))


def io_bottleneck(a: Analysis) -> Finding:
    rule, title = "io_bottleneck", "I/O bottleneck"
    if not a.has_gpu:
        return Finding(rule, title, NOT_EVALUATED,
                       f"no GPU samples ({_gpu_reason(a)}): the rule looks for a GPU starved by "
                       f"I/O")
    if not any(s.sampled(IOWAIT_FIELD) for s in a.ranks.values()):
        return Finding(rule, title, NOT_EVALUATED,
                       f"the samples carry no I/O wait ({IOWAIT_FIELD}): this profile was "
                       f"written by a dtrain that does not record it")
    t = a.thresholds
    judged, fired, evidence, fractions = 0, [], [], {}
    for s in a.ranks.values():
        pairs = [(x[IOWAIT_FIELD], x["gpu"]["utilization_pct"]) for x in s.judged_samples
                 if is_number(x.get(IOWAIT_FIELD)) and isinstance(x.get("gpu"), dict)
                 and is_number(x["gpu"].get("utilization_pct"))]
        if len(pairs) < t["min_samples"]:
            continue
        judged += 1
        stalled = [(io, gpu) for io, gpu in pairs
                   if io > t["io_wait_high_pct"] and gpu < t["io_gpu_low_pct"]]
        fractions[s.rank] = len(stalled) / len(pairs)
        if fractions[s.rank] > t["io_bottleneck_fraction"]:
            fired.append(s.rank)
            line = (f"rank {s.rank} (host {s.host}): {_pct(fractions[s.rank])} of its "
                    f"{len(pairs)} samples wait for I/O (a median "
                    f"{median(io for io, _ in stalled):.0f}% "
                    f"of the machine's CPU time) while its GPU is under {t['io_gpu_low_pct']:g}% "
                    f"busy (median {median(g for _, g in stalled):.0f}%)")
            if "disk_read_bytes_per_s" in s.cpu:
                line += f"; disk reads a median {human_bytes(s.cpu['disk_read_bytes_per_s'])}/s"
            own = s.sampled("process_read_bytes_per_s")
            if own:
                line += f" ({human_bytes(median(own))}/s by the rank itself)"
            if "data" in s.median_share:
                line += f"; the data phase takes a median {_pct(s.median_share['data'])} of a step"
            evidence.append(line)
    if not judged:
        return Finding(rule, title, NOT_EVALUATED,
                       f"fewer than {int(t['min_samples'])} samples with I/O wait and GPU "
                       f"utilization after warm-up on every rank (threshold min_samples)")
    if not fired:
        worst = max(fractions, key=lambda r: fractions[r])
        return Finding(rule, title, QUIET,
                       f"at most {_pct(fractions[worst])} of a rank's samples (rank {worst}) wait "
                       f"for I/O above {t['io_wait_high_pct']:g}% with the GPU under "
                       f"{t['io_gpu_low_pct']:g}% busy; {_pct(t['io_bottleneck_fraction'])} needed")
    return Finding(
        rule, title, FIRED,
        f"the GPU of {_ranks(fired)} waits for storage most of the time", evidence,
        "The input is read from storage more slowly than the GPU consumes it: copy the data set "
        "to local NVMe (or memory) first, read fewer and larger files (shards or record files "
        "rather than one file per sample), read ahead in loader threads with a deeper prefetch "
        "queue, and cache decoded samples.",
        ranks=fired)


def _histogram(values: list[float], bins: int = 50) -> list[float]:
    """Shares of `values` in `bins` equal bins over 0-100% (100 falls in the last)."""
    counts = [0] * bins
    for v in values:
        counts[min(bins - 1, max(0, int(v / (100 / bins))))] += 1
    n = sum(counts)
    return [c / n for c in counts] if n else counts


def js_distance(p: list[float], q: list[float]) -> float:
    """The Jensen-Shannon distance of two distributions: the square root of the mean of their
    Kullback-Leibler divergences from their average, in nats (0 to sqrt(ln 2))."""
    m = [(x + y) / 2 for x, y in zip(p, q)]

    def kl(a, b):
        return sum(x * math.log(x / y) for x, y in zip(a, b) if x > 0)
    return math.sqrt(max(0.0, (kl(p, m) + kl(q, m)) / 2))


def load_balancing(a: Analysis) -> Finding:
    rule, title = "load_balancing", "GPU load balancing"
    gpus = devices(a)
    if not gpus:
        return Finding(rule, title, NOT_EVALUATED, f"no GPU samples ({_gpu_reason(a)})")
    t = a.thresholds
    histograms, medians = {}, {}
    for key, ranks in gpus.items():
        s = a.ranks[ranks[0]]
        values = [v for _, v in s.gpu_series("utilization_pct", s.judged_samples)]
        if len(values) >= t["min_samples"]:
            histograms[key] = _histogram(values)
            medians[key] = median(values)
    hosts = {}
    for host, index in histograms:
        hosts.setdefault(host, []).append(index)
    pairs = []
    for host, indices in hosts.items():
        indices.sort()
        for i, x in enumerate(indices):
            for y in indices[i + 1:]:
                pairs.append((js_distance(histograms[(host, x)], histograms[(host, y)]),
                              host, x, y))
    if not pairs:
        return Finding(rule, title, NOT_EVALUATED,
                       "no host with two GPUs that have enough samples "
                       f"(min_samples {int(t['min_samples'])} after warm-up): nothing to balance")
    pairs.sort(reverse=True)
    far = [p for p in pairs if p[0] > t["load_balancing_distance"]]
    if not far:
        d, host, x, y = pairs[0]
        return Finding(rule, title, QUIET,
                       f"the GPUs of each host are about equally busy: the utilization histograms "
                       f"of GPUs {x} and {y} of host {host} differ the most, {d:.2f} apart "
                       f"(Jensen-Shannon distance; threshold {t['load_balancing_distance']:g})")

    def gpu(host, index):
        return (f"GPU {index} ({_ranks(gpus[(host, index)])}, median "
                f"{medians[(host, index)]:.0f}% busy)")
    evidence = [f"host {host}: {gpu(host, x)} and {gpu(host, y)} are {d:.2f} apart"
                for d, host, x, y in far[:6]]
    if len(far) > 6:
        evidence.append(f"and {len(far) - 6} more pairs above {t['load_balancing_distance']:g}")
    shared = [(key, rs) for key, rs in gpus.items() if len(rs) > 1]
    for (host, index), rs in shared:
        evidence.append(f"{_ranks(rs)} share GPU {index} of host {host}")
    fired = sorted({r for _, host, x, y in far for r in gpus[(host, x)] + gpus[(host, y)]})
    return Finding(
        rule, title, FIRED,
        f"some GPUs of host {', '.join(sorted({h for _, h, _, _ in far}))} are much busier than "
        f"others", evidence,
        ("Ranks share a GPU while another may idle: give each rank its own device "
         "(dtrain::cuda::set_device_from_local_rank()). " if shared else "")
        + "Give every rank the same work: equal batches (DistributedSampler), balanced shards of "
        "variable-size samples (SplitSortedBucketSampler); then see whether the less busy ranks "
        "wait for their input (their data phase) or for the others.",
        ranks=fired)


def overall_system_usage(a: Analysis) -> Finding:
    rule, title = "overall_system_usage", "Overall system usage"
    usage = system_usage(a)
    if not any(usage.values()):
        return Finding(rule, title, NOT_EVALUATED, "no system samples recorded")
    evidence = []
    for host, stats in usage.items():
        for u in stats:
            evidence.append(f"host {host}, {u.metric} ({u.unit}): p50 {u.p50:.3g}, p95 "
                            f"{u.p95:.3g}, p99 {u.p99:.3g}, max {u.maximum:.3g}, min "
                            f"{u.minimum:.3g} ({u.samples} samples)")
    return Finding(rule, title, SUMMARY,
                   f"percentiles of the system's use on {len(usage)} host(s); a summary, it "
                   f"never fires", evidence)


RULES = (low_gpu_utilization, data_loader_bound, communication_bound, straggler_rank,
         batch_too_small, cpu_oversubscribed, engine_busy_wait, step_outlier,
         max_initialization_time, gpu_memory_increase, io_bottleneck, load_balancing,
         overall_system_usage)


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
