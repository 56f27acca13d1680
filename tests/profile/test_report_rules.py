"""Each dtrain-report rule on synthetic profiles: it fires when its problem is there, stays quiet
when it is not (a healthy run fires nothing), and says when it cannot judge."""

import json
import math
import sys
import tempfile
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import synthetic  # noqa: E402
from dtrain_report import rules, thresholds  # noqa: E402
from dtrain_report.analysis import analyze  # noqa: E402
from dtrain_report.profile_reader import load_run  # noqa: E402
from dtrain_report.rules import FIRED, NOT_EVALUATED, QUIET, SUMMARY, evaluate  # noqa: E402

LONG = 300  # steps: enough for the step-outlier rule (101 after warm-up) and the sample rules


class RuleTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self._tmp.cleanup)
        self.count = 0

    def judge(self, limits=None, **run):
        self.count += 1
        folder = synthetic.write_run(Path(self._tmp.name) / f"run{self.count}", **run)
        a = analyze(load_run([folder]), limits or thresholds.defaults())
        return {f.rule: f for f in evaluate(a)}

    def assertStatus(self, findings, expected: dict):
        got = {rule: findings[rule].status for rule in expected}
        self.assertEqual(got, expected,
                         "\n".join(f"{r}: {f.status}: {f.summary}" for r, f in findings.items()))


class HealthyRun(RuleTest):
    def test_a_healthy_run_fires_nothing_and_every_rule_judges_it(self):
        findings = self.judge(steps=LONG)
        expected = {r: QUIET for r in findings}
        expected["overall_system_usage"] = SUMMARY
        self.assertEqual({r: f.status for r, f in findings.items()}, expected, "\n".join(
            f"{r}: {f.summary}" for r, f in findings.items()))

    def test_without_a_gpu_the_gpu_rules_are_not_evaluated_and_say_why(self):
        findings = self.judge(gpu=None)
        for rule in ("low_gpu_utilization", "batch_too_small"):
            self.assertEqual(findings[rule].status, NOT_EVALUATED)
            self.assertIn("NVML not loaded (test)", findings[rule].summary)
        self.assertEqual(findings["communication_bound"].status, QUIET)


class LowGpuUtilization(RuleTest):
    def test_fires_on_the_ranks_whose_gpu_is_idle_and_points_at_the_dominant_wait(self):
        def gpu(rank, t):
            g = synthetic.healthy_gpu(rank, t)
            g["utilization_pct"] = 35.0 if rank in (1, 3) else 92.0
            return g

        def phases(rank, step):
            p = dict(synthetic.HEALTHY_PHASES)
            if rank in (1, 3):
                p["data"] = 60.0
            return p
        f = self.judge(gpu=gpu, phases=phases)["low_gpu_utilization"]
        self.assertEqual(f.status, FIRED)
        self.assertEqual(f.ranks, [1, 3])
        self.assertIn("median 35%", f.evidence[0])
        self.assertIn("Data-loader bound", f.suggestion)

    def test_quiet_at_the_threshold_and_its_value_is_configurable(self):
        def gpu(rank, t):
            g = synthetic.healthy_gpu(rank, t)
            g["utilization_pct"] = 75.0
            return g
        self.assertEqual(self.judge(gpu=gpu)["low_gpu_utilization"].status, QUIET)
        limits = thresholds.load(None, ["gpu_utilization_low_pct=80"])
        self.assertEqual(self.judge(limits, gpu=gpu)["low_gpu_utilization"].status, FIRED)


class DataLoaderBound(RuleTest):
    def test_fires_on_the_rank_waiting_for_data_with_its_steps(self):
        def phases(rank, step):
            p = dict(synthetic.HEALTHY_PHASES)
            if rank == 2:
                p["data"] = 45.0
            return p
        f = self.judge(phases=phases)["data_loader_bound"]
        self.assertEqual(f.status, FIRED)
        self.assertEqual(f.ranks, [2])
        self.assertIn("rank 2", f.evidence[0])
        self.assertIn("steps 2-39", f.evidence[0])  # the warm-up steps 0-1 are not judged
        self.assertEqual(f.steps, list(range(2, 40)))

    def test_quiet_below_the_threshold(self):
        def phases(rank, step):
            p = dict(synthetic.HEALTHY_PHASES)
            p["data"] = 15.0  # about 13% of the step
            return p
        self.assertEqual(self.judge(phases=phases)["data_loader_bound"].status, QUIET)

    def test_not_evaluated_without_a_data_phase(self):
        def phases(rank, step):
            return {k: v for k, v in synthetic.HEALTHY_PHASES.items() if k != "data"}
        f = self.judge(phases=phases)["data_loader_bound"]
        self.assertEqual(f.status, NOT_EVALUATED)
        self.assertIn("Phase::data", f.summary)


class CommunicationBound(RuleTest):
    def test_fires_when_every_rank_waits_for_communication(self):
        def phases(rank, step):
            p = dict(synthetic.HEALTHY_PHASES)
            p["communication_wait"] = 70.0
            return p
        f = self.judge(phases=phases)["communication_bound"]
        self.assertEqual(f.status, FIRED)
        self.assertEqual(f.ranks, [0, 1, 2, 3])
        self.assertIn("46 MB reduced", f.evidence[0])  # engine counters as evidence

    def test_the_hidden_share_of_communication_as_evidence(self):
        def phases(rank, step):
            p = dict(synthetic.HEALTHY_PHASES)
            p["communication_wait"] = 70.0
            return p

        def engine(**ns):
            return lambda rank, step, p: {"collectives": 2, "bytes_reduced": 4.6e7, **ns}
        f = self.judge(phases=phases, jitter=0.0, engine=engine(in_flight_ns=100e6))[
            "communication_bound"]
        self.assertIn("; 30% of its communication time overlaps the rest of the step",
                      f.evidence[0])
        f = self.judge(phases=phases, jitter=0.0, engine=engine(collective_ns=100e6))[
            "communication_bound"]
        self.assertIn("; at least 30% of its communication", f.evidence[0])
        f = self.judge(phases=phases, jitter=0.0, engine=engine(collective_ns=50e6))[
            "communication_bound"]
        self.assertNotIn("overlaps", f.evidence[0])  # a lower bound of 0 says nothing

    def test_quiet_when_only_the_ranks_waiting_for_a_straggler_wait(self):
        def phases(rank, step):
            p = dict(synthetic.HEALTHY_PHASES)
            if rank == 0:
                p["forward"] += 60.0
            else:
                p["communication_wait"] += 60.0
            return p
        findings = self.judge(phases=phases)
        self.assertStatus(findings, {"communication_bound": QUIET, "straggler_rank": FIRED})
        self.assertIn("Straggler rank", findings["communication_bound"].summary)


class StragglerRank(RuleTest):
    @staticmethod
    def slow_rank(slow, extra_ms, phase="forward", every=1):
        def phases(rank, step):
            p = dict(synthetic.HEALTHY_PHASES)
            if step % every == 0:
                if rank == slow:
                    p[phase] += extra_ms
                else:
                    p["communication_wait"] += extra_ms
            return p
        return phases

    def test_fires_on_the_slow_rank_and_names_the_slow_phase(self):
        f = self.judge(phases=self.slow_rank(2, 25.0))["straggler_rank"]
        self.assertEqual(f.status, FIRED)
        self.assertEqual(f.ranks, [2])
        self.assertIn("slowest in 100%", f.evidence[0])
        self.assertIn("mostly in forward", f.evidence[1])
        self.assertIn("check host node0", f.suggestion)

    def test_a_slow_data_phase_points_at_the_input(self):
        f = self.judge(phases=self.slow_rank(1, 25.0, "data"))["straggler_rank"]
        self.assertEqual(f.status, FIRED)
        self.assertIn("SplitSortedBucketSampler", f.suggestion)

    def test_quiet_when_slow_only_now_and_then(self):
        f = self.judge(phases=self.slow_rank(2, 25.0, every=4))["straggler_rank"]
        self.assertEqual(f.status, QUIET)

    def test_quiet_for_a_small_difference(self):
        f = self.judge(phases=self.slow_rank(2, 5.0))["straggler_rank"]  # 5%, under 1.15x
        self.assertEqual(f.status, QUIET)

    def test_not_evaluated_for_one_rank(self):
        f = self.judge(ranks=1)["straggler_rank"]
        self.assertEqual(f.status, NOT_EVALUATED)

    def test_steps_that_mark_only_their_communication_wait(self):
        """As DistributedOptimizer::step() and handle waits record them, with no code changes:
        the rank's own work is the step minus the wait, and the finding says it is not broken
        into phases."""
        def phases(rank, step):
            return {"communication_wait": 2.0 if rank == 1 else 27.0}
        f = self.judge(phases=phases, other=lambda r, i: 30.0 if r == 1 else 5.0)[
            "straggler_rank"]  # rank 1 works 25 ms longer, the others wait for it
        self.assertEqual(f.status, FIRED)
        self.assertEqual(f.ranks, [1])
        self.assertIn("rank 1's extra time is in its own work between the exchanges", f.evidence[1])
        self.assertIn("mark its data, forward and backward phases", f.suggestion)


class BatchTooSmall(RuleTest):
    @staticmethod
    def gpu(util, memory_fraction):
        def g(rank, t):
            x = synthetic.healthy_gpu(rank, t)
            x["utilization_pct"] = util
            x["memory_used_bytes"] = memory_fraction * synthetic.GPU_MEMORY
            return x
        return g

    def test_fires_for_an_idle_gpu_with_memory_to_spare(self):
        f = self.judge(gpu=self.gpu(30.0, 0.12), batch=16)["batch_too_small"]
        self.assertEqual(f.status, FIRED)
        self.assertEqual(f.ranks, [0, 1, 2, 3])
        self.assertIn("12% of its 80 GB", f.evidence[0])
        self.assertIn("batch 16 per rank", f.evidence[0])

    def test_quiet_when_memory_is_full(self):
        findings = self.judge(gpu=self.gpu(30.0, 0.85))
        self.assertStatus(findings, {"batch_too_small": QUIET, "low_gpu_utilization": FIRED})

    def test_quiet_when_the_input_is_the_limit(self):
        def phases(rank, step):
            p = dict(synthetic.HEALTHY_PHASES)
            p["data"] = 60.0
            return p
        findings = self.judge(gpu=self.gpu(30.0, 0.12), phases=phases)
        self.assertStatus(findings, {"batch_too_small": QUIET, "data_loader_bound": FIRED})


class CpuOversubscribed(RuleTest):
    def test_fires_on_the_saturated_host_only(self):
        def system(rank, t):
            s = synthetic.healthy_system(rank, t)
            if rank >= 2:  # node1
                s.update(system_cpu_pct=99.0, procs_running=40, involuntary_switches_per_s=900.0,
                         process_cpu_pct=800.0)
            return s
        f = self.judge(system=system, host=lambda r: "node0" if r < 2 else "node1")[
            "cpu_oversubscribed"]
        self.assertEqual(f.status, FIRED)
        self.assertEqual(f.ranks, [2, 3])
        self.assertEqual(len(f.evidence), 1)
        self.assertIn("host node1 (16 CPUs, ranks 2, 3)", f.evidence[0])
        self.assertIn("2.5 runnable tasks per CPU", f.evidence[0])
        self.assertIn("rank 2 900/s", f.evidence[0])

    def test_a_communication_finding_points_at_oversubscribed_cpus_first(self):
        def system(rank, t):
            s = synthetic.healthy_system(rank, t)
            s.update(system_cpu_pct=100.0, procs_running=48)
            return s

        def phases(rank, step):
            p = dict(synthetic.HEALTHY_PHASES)
            p["communication_wait"] = 70.0
            return p
        findings = self.judge(system=system, phases=phases)
        self.assertStatus(findings, {"communication_bound": FIRED, "cpu_oversubscribed": FIRED})
        self.assertTrue(findings["communication_bound"].suggestion.startswith(
            "First see 'CPU oversubscribed'"))
        self.assertIn("other programs about", findings["cpu_oversubscribed"].evidence[0])

    def test_quiet_when_busy_without_waiting_tasks(self):
        def system(rank, t):
            s = synthetic.healthy_system(rank, t)
            s.update(system_cpu_pct=97.0, procs_running=14)  # busy, but a CPU for every task
            return s
        self.assertEqual(self.judge(system=system)["cpu_oversubscribed"].status, QUIET)


WAIT_COUNTERS = synthetic.HEALTHY_ENGINE_COUNTERS + ("collective_ns", "engine_cpu_ns")


class EngineBusyWait(RuleTest):
    """The healthy step is 98 ms (97 ms of phases, 1 ms outside them); with jitter=0.0 every
    figure is exact."""

    def waits(self, cpu_ms, collective_ms=30.0, hosts=2, counters=WAIT_COUNTERS, limits=None):
        """4 ranks spread over `hosts` hosts whose engine, each step, spends `collective_ms` in
        collectives and uses cpu_ms(rank) (or `cpu_ms`) of CPU; the writer leaves out a counter
        that did not move, as dtrain's does."""
        def engine(rank, step, p):
            e = dict(synthetic.healthy_engine(rank, step, p))
            cpu = cpu_ms(rank) if callable(cpu_ms) else cpu_ms
            for name, ms in (("collective_ns", collective_ms), ("engine_cpu_ns", cpu)):
                if ms > 0 and name in counters:
                    e[name] = ms * 1e6
            return e
        return self.judge(limits, jitter=0.0, engine=engine, engine_counters=counters,
                          host=lambda r: f"node{r * hosts // 4}")["engine_busy_wait"]

    def test_fires_across_hosts_on_the_rank_whose_engine_polls_through_its_collectives(self):
        f = self.waits(lambda r: 29.0 if r == 3 else 3.0)
        self.assertEqual(f.status, FIRED, f.summary)
        self.assertEqual(f.ranks, [3])
        self.assertEqual(f.steps, list(range(2, 40)))
        self.assertIn("across 2 hosts: it uses 0.97 cores during them", f.summary)
        self.assertEqual(f.evidence, [
            "rank 3 (host node1): its engine thread used 0.97 cores while executing collectives "
            "over steps 2-39: 29 ms of CPU per step against 30 ms in collectives, which take 31% "
            "of a 98 ms step; the engine's CPU is 30% of the step's time"])
        for advice in ("DTRAIN_WAIT_MAX_SLEEP_US is not 0", "separate hosts",
                       "MPIR_CVAR_ASYNC_PROGRESS"):
            self.assertIn(advice, f.suggestion)

    def test_quiet_across_hosts_when_the_engine_sleeps_while_it_waits(self):
        f = self.waits(3.0)
        self.assertEqual(f.status, QUIET, f.summary)
        self.assertIn("at 0.10 cores in collectives that take 31% of its step", f.summary)

    def test_not_evaluated_for_a_profile_of_a_dtrain_without_the_engine_cpu_clock(self):
        f = self.waits(29.0, counters=synthetic.HEALTHY_ENGINE_COUNTERS + ("collective_ns",))
        self.assertEqual(f.status, NOT_EVALUATED, f.summary)
        self.assertIn("the engine thread's CPU time (engine_cpu_ns) is not among the profile's "
                      "engine counters", f.summary)

    def test_the_header_not_the_steps_says_whether_the_clock_is_recorded(self):
        """A counter that did not move is left out of the steps; the header still lists it."""
        f = self.waits(0.0)
        self.assertEqual(f.status, QUIET, f.summary)
        self.assertIn("at 0.00 cores", f.summary)

    def test_quiet_on_one_host_where_shared_memory_waits_poll_by_design(self):
        f = self.waits(29.0, hosts=1)
        self.assertEqual(f.status, QUIET, f.summary)
        self.assertTrue(f.summary.startswith("one host: shared-memory waits poll by design"),
                        f.summary)
        # Whatever the profile records: nothing on one host would be a finding.
        f = self.waits(29.0, hosts=1, counters=synthetic.HEALTHY_ENGINE_COUNTERS)
        self.assertEqual(f.status, QUIET, f.summary)

    def test_quiet_when_collectives_take_little_of_the_step(self):
        f = self.waits(5.0, collective_ms=5.0)  # a polling engine, 5% of the step
        self.assertEqual(f.status, QUIET, f.summary)
        self.assertIn("at 1.00 cores in collectives that take 5% of its step", f.summary)

    def test_the_thresholds_change_the_verdict(self):
        self.assertEqual(self.waits(12.0).status, QUIET)  # 0.4 cores
        limits = thresholds.load(None, ["engine_wait_cores=0.3"])
        self.assertEqual(self.waits(12.0, limits=limits).status, FIRED)
        limits = thresholds.load(None, ["engine_wait_share=0.05"])
        self.assertEqual(self.waits(5.0, collective_ms=5.0, limits=limits).status, FIRED)


def with_phase(change):
    """Healthy phases with change(rank, step, phases) applied."""
    def phases(rank, step):
        p = dict(synthetic.HEALTHY_PHASES)
        change(rank, step, p)
        return p
    return phases


class StepOutlier(RuleTest):
    OUTLIER_STEPS = range(20, 20 + 15 * 17, 17)  # 15 steps, all after the warm-up

    def slow_steps(self, count, rank=1):
        steps = set(list(self.OUTLIER_STEPS)[:count])

        def change(r, step, p):
            if step in steps:
                if r == rank:
                    p["data"] += 200.0
                else:
                    p["communication_wait"] += 200.0
        return with_phase(change)

    def test_fires_with_the_threshold_in_closed_form_and_names_the_rank_behind_the_waits(self):
        f = self.judge(steps=LONG, jitter=0.0, phases=self.slow_steps(15))["step_outlier"]
        self.assertEqual(f.status, FIRED, f.summary)
        self.assertEqual(f.ranks, [0, 1, 2, 3])
        self.assertEqual(f.steps, list(self.OUTLIER_STEPS))
        # 298 judged steps of 98 ms, 15 of them 298 ms: the limit is mean + 3 population sigma.
        n, k = LONG - 2, 15
        mu = 98 + 200 * k / n
        sigma = 200 * math.sqrt(k / n * (1 - k / n))
        evidence = {int(e.split(":")[0].split()[1]): e for e in f.evidence}
        self.assertIn(f"15 of 298 steps took longer than {mu + 3 * sigma:.0f} ms (its mean "
                      f"{mu:.0f} ms + 3 x {sigma:.3g} ms)", evidence[1])
        self.assertIn("in them data takes a median 200 ms more", evidence[1])
        self.assertIn("in them communication_wait takes a median 200 ms more", evidence[0])
        self.assertIn("rank 1's own work was the longest in 15 of those 15 steps", evidence[0])
        self.assertIn("Rank 1's input stalls", f.suggestion)

    def test_ten_outliers_are_tolerated_eleven_are_not(self):
        self.assertEqual(self.judge(steps=LONG, phases=self.slow_steps(10))["step_outlier"]
                         .status, QUIET)
        self.assertEqual(self.judge(steps=LONG, phases=self.slow_steps(11))["step_outlier"]
                         .status, FIRED)

    def test_not_evaluated_on_a_short_run(self):
        f = self.judge(phases=self.slow_steps(15))["step_outlier"]
        self.assertEqual(f.status, NOT_EVALUATED)
        self.assertIn("38 after warm-up, 101 needed", f.summary)


class MaxInitializationTime(RuleTest):
    @staticmethod
    def uptime(minutes_by_rank):
        return lambda r: {"process_uptime_ms": minutes_by_rank.get(r, 0.5) * 60e3}

    def test_fires_on_the_rank_whose_process_started_long_before_its_first_step(self):
        f = self.judge(header=self.uptime({2: 21.0}))["max_initialization_time"]
        self.assertEqual(f.status, FIRED)
        self.assertEqual(f.ranks, [2])
        self.assertIn("rank 2 (host node0): its first step began 21.0 min after the process "
                      "started (21.0 min before profiling began, 0.0 s after)",
                      f.evidence[0])

    def test_quiet_under_the_threshold(self):
        f = self.judge(header=self.uptime({2: 19.0}))["max_initialization_time"]
        self.assertEqual(f.status, QUIET)
        self.assertIn("latest: rank 2, 19.0 min after the process started", f.summary)
        limits = thresholds.load(None, ["max_initialization_minutes=10"])
        f = self.judge(limits, header=self.uptime({2: 19.0}))["max_initialization_time"]
        self.assertEqual(f.status, FIRED)

    def test_a_run_without_steps_fires_once_it_waited_longer(self):
        f = self.judge(steps=0, header=self.uptime({0: 25.0}))["max_initialization_time"]
        self.assertEqual(f.status, FIRED)
        self.assertIn("no step had begun 25.0 min after the process started", f.evidence[0])
        f = self.judge(steps=0)["max_initialization_time"]
        self.assertEqual(f.status, NOT_EVALUATED)
        self.assertIn("no steps seen in the", f.summary)

    def test_not_evaluated_when_recording_began_after_the_first_step(self):
        self.count += 1
        folder = synthetic.write_run(Path(self._tmp.name) / f"run{self.count}", ranks=2)
        for file in folder.glob("*.jsonl"):
            lines = [json.loads(x) for x in file.read_text().splitlines()]
            lines = [x for x in lines if x["type"] != "step" or x["step"] >= 5]
            for x in lines:
                if x["type"] == "start":
                    x["step"] = 5
            file.write_text("".join(json.dumps(x) + "\n" for x in lines))
        findings = {f.rule: f for f in evaluate(analyze(load_run([folder]), thresholds.defaults()))}
        self.assertEqual(findings["max_initialization_time"].status, NOT_EVALUATED)
        self.assertIn("start_recording = false", findings["max_initialization_time"].summary)


def gpu_with(**by_rank):
    """Healthy GPU samples, with fields replaced by f(rank, t) where given."""
    def g(rank, t):
        x = synthetic.healthy_gpu(rank, t)
        for key, f in by_rank.items():
            v = f(rank, t)
            if v is not None:
                x[key] = v
        return x
    return g


class GpuMemoryIncrease(RuleTest):
    @staticmethod
    def memory(pct_of):
        return gpu_with(memory_used_bytes=lambda r, t: None if pct_of(r, t) is None
                        else pct_of(r, t) / 100 * synthetic.GPU_MEMORY)

    def test_a_jump_fires_with_its_size(self):
        gpu = self.memory(lambda r, t: (60.0 if t > 15 else 40.0) if r == 3 else None)
        f = self.judge(steps=LONG, gpu=gpu)["gpu_memory_increase"]
        self.assertEqual(f.status, FIRED)
        self.assertEqual(f.ranks, [3])
        self.assertIn("GPU 3 of host node0 (rank 3): memory in use grew by 20.0% of the device "
                      "of its 80 GB", f.evidence[0])
        self.assertIn("40% at", f.evidence[0])
        self.assertIn("60% at", f.evidence[0])

    def test_a_slow_leak_fires_window_over_window(self):
        # 1.2 points a second, 0.6 a sample: adjacent windows of 10 samples differ by 6 points.
        gpu = self.memory(lambda r, t: 20.0 + 1.2 * t if r == 0 else None)
        f = self.judge(steps=LONG, gpu=gpu)["gpu_memory_increase"]
        self.assertEqual(f.status, FIRED)
        self.assertIn("grew by 6.0% of the device", f.evidence[0])

    def test_quiet_for_a_small_step(self):
        gpu = self.memory(lambda r, t: 44.0 if t > 15 else 40.0)
        f = self.judge(steps=LONG, gpu=gpu)["gpu_memory_increase"]
        self.assertEqual(f.status, QUIET)
        self.assertIn("at most 4.0% of the device", f.summary)

    def test_not_evaluated_without_a_gpu(self):
        f = self.judge(gpu=None)["gpu_memory_increase"]
        self.assertEqual(f.status, NOT_EVALUATED)
        self.assertIn("NVML not loaded (test)", f.summary)


class IoBottleneck(RuleTest):
    def run_with(self, iowait, gpu_util, **kw):
        def system(rank, t):
            s = synthetic.healthy_system(rank, t)
            s["system_iowait_pct"] = iowait(rank, t)
            return s
        return self.judge(steps=LONG, system=system,
                          gpu=gpu_with(utilization_pct=gpu_util), **kw)["io_bottleneck"]

    def test_fires_when_the_gpu_idles_while_the_machine_waits_for_io(self):
        f = self.run_with(lambda r, t: 80.0, lambda r, t: 5.0 if r == 1 else None)
        self.assertEqual(f.status, FIRED)
        self.assertEqual(f.ranks, [1])
        self.assertIn("rank 1 (host node0): 100% of its", f.evidence[0])
        self.assertIn("a median 80% of the machine's CPU time", f.evidence[0])

    def test_quiet_when_the_gpu_is_busy_or_the_wait_is_low(self):
        self.assertEqual(self.run_with(lambda r, t: 80.0, lambda r, t: 50.0).status, QUIET)
        self.assertEqual(self.run_with(lambda r, t: 30.0, lambda r, t: 5.0).status, QUIET)

    def test_not_evaluated_without_io_wait_in_the_samples(self):
        def system(rank, t):
            s = synthetic.healthy_system(rank, t)
            del s["system_iowait_pct"]
            return s
        f = self.judge(system=system)["io_bottleneck"]
        self.assertEqual(f.status, NOT_EVALUATED)
        self.assertIn("system_iowait_pct", f.summary)


class LoadBalancing(RuleTest):
    def test_the_distance_in_closed_form(self):
        self.assertAlmostEqual(rules.js_distance([1, 0], [0, 1]), math.sqrt(math.log(2)))
        self.assertAlmostEqual(rules.js_distance([1, 0], [1, 0]), 0.0)
        # m = (0.75, 0.25): KL(p|m) = ln(4/3), KL(q|m) = (ln(2/3) + ln 2) / 2
        expected = math.sqrt((math.log(4 / 3) + (math.log(2 / 3) + math.log(2)) / 2) / 2)
        self.assertAlmostEqual(rules.js_distance([1, 0], [0.5, 0.5]), expected)
        self.assertAlmostEqual(expected, 0.4645, places=4)
        h = rules._histogram([0.0, 1.9, 2.0, 100.0])
        self.assertEqual((h[0], h[1], h[49], len(h)), (0.5, 0.25, 0.25, 50))

    def test_fires_for_gpus_of_a_host_busy_to_different_degrees(self):
        gpu = gpu_with(utilization_pct=lambda r, t: 40.0 if r == 2 else 95.0)
        f = self.judge(steps=LONG, ranks=3, gpu=gpu, gpu_index=lambda r: 0 if r < 2 else 1)[
            "load_balancing"]
        self.assertEqual(f.status, FIRED)
        self.assertIn("host node0: GPU 0 (ranks 0, 1, median 95% busy) and GPU 1 (rank 2, median "
                      "40% busy) are 0.83 apart", f.evidence[0])
        self.assertIn("ranks 0, 1 share GPU 0 of host node0", f.evidence)
        self.assertIn("set_device_from_local_rank", f.suggestion)

    def test_quiet_for_equally_busy_gpus_and_gpus_on_different_hosts(self):
        self.assertEqual(self.judge(steps=LONG)["load_balancing"].status, QUIET)
        gpu = gpu_with(utilization_pct=lambda r, t: 40.0 if r == 1 else 95.0)
        f = self.judge(steps=LONG, ranks=2, gpu=gpu, host=lambda r: f"node{r}")["load_balancing"]
        self.assertEqual(f.status, NOT_EVALUATED)
        self.assertIn("no host with two GPUs", f.summary)


class OverallSystemUsage(RuleTest):
    def test_a_summary_with_percentiles_in_closed_form(self):
        def system(rank, t):
            s = synthetic.healthy_system(rank, t)
            s["system_cpu_pct"] = 2 * t  # sample k (at 0.5 k s) reads k
            return s
        f = self.judge(system=system, ranks=2)["overall_system_usage"]
        self.assertEqual(f.status, SUMMARY)
        line = next(e for e in f.evidence if "machine CPU" in e)
        n = int(line.split("(")[-1].split()[0])  # samples 1..n
        self.assertEqual(line, f"host node0, machine CPU (%): p50 {1 + (n - 1) * 0.5:.3g}, p95 "
                               f"{1 + (n - 1) * 0.95:.3g}, p99 {1 + (n - 1) * 0.99:.3g}, max "
                               f"{n}, min 1 ({n} samples)")

    def test_never_fires(self):
        for run in ({}, {"gpu": None}, {"steps": 0}):
            self.assertEqual(self.judge(**run)["overall_system_usage"].status, SUMMARY)


class Thresholds(unittest.TestCase):
    def test_unknown_names_and_bad_values_are_errors_that_say_what_is_accepted(self):
        with self.assertRaisesRegex(thresholds.ThresholdError, "unknown threshold 'data_share'"):
            thresholds.load(None, ["data_share=0.3"])
        with self.assertRaisesRegex(thresholds.ThresholdError, "out of range: expected a number "
                                                               "from 0 to 1"):
            thresholds.load(None, ["data_share_high=1.5"])
        with self.assertRaisesRegex(thresholds.ThresholdError, "expected NAME=VALUE"):
            thresholds.load(None, ["data_share_high"])
        with self.assertRaisesRegex(thresholds.ThresholdError, "must be a whole number"):
            thresholds.load(None, ["warmup_steps=1.5"])

    def test_a_json_file_then_the_command_line(self):
        with tempfile.TemporaryDirectory() as d:
            f = Path(d) / "t.json"
            f.write_text('{"data_share_high": 0.4, "straggler_slowdown": 1.5}')
            t = thresholds.load(f, ["data_share_high=0.35"])
            self.assertEqual(t["data_share_high"], 0.35)
            self.assertEqual(t["straggler_slowdown"], 1.5)
            f.write_text("[1, 2]")
            with self.assertRaisesRegex(thresholds.ThresholdError, "expected a JSON object"):
                thresholds.load(f, [])


if __name__ == "__main__":
    unittest.main()
