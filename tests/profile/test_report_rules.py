"""Each dtrain-report rule on synthetic profiles: it fires when its problem is there, stays quiet
when it is not (a healthy run fires nothing), and says when it cannot judge."""

import sys
import tempfile
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import synthetic  # noqa: E402
from dtrain_report import thresholds  # noqa: E402
from dtrain_report.analysis import analyze  # noqa: E402
from dtrain_report.profile_reader import load_run  # noqa: E402
from dtrain_report.rules import FIRED, NOT_EVALUATED, QUIET, evaluate  # noqa: E402


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
    def test_a_healthy_run_fires_nothing(self):
        findings = self.judge()
        self.assertEqual({r: f.status for r, f in findings.items()},
                         {r: QUIET for r in findings}, "\n".join(
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
