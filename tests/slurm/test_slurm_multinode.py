#!/usr/bin/env python3
"""dtrain jobs across two SLURM nodes of 2 CPUs each: two slurmd, each in its own network, UTS,
IPC and mount namespace, joined by a veth pair (local_slurm.py). dtrainrun in a batch script of
`sbatch -N 2 --ntasks-per-node=2` starts 4 ranks, 2 per node, through srun; srun --mpi=pmi2
starts them directly; a rank failing on the second node is the job's exit code. Run as a
script: exit 77 where SLURM or network namespaces cannot run (slurm_test_support.py)."""
import os
import re
import shlex
import sys

from slurm_test_support import (DTRAINRUN, PLAIN_TRAIN, PROBE, SlurmTest, main, plain_json,
                                rank_json)

RUN = shlex.quote(os.path.abspath(DTRAINRUN))
NODES = ["dtrain-node0", "dtrain-node1"]
EPOCHS = 4


class TwoNodes(SlurmTest):
    def check_topology(self, topology, text):
        self.assertEqual(sorted(topology), [0, 1, 2, 3], text)
        for rank, t in topology.items():
            self.assertEqual((t["size"], t["local_rank"], t["local_size"], t["cross_rank"],
                              t["cross_size"], t["host"]),
                             (4, rank % 2, 2, rank // 2, 2, NODES[rank // 2]), text)

    def test_sbatch_two_nodes(self):
        self.need(PROBE, PLAIN_TRAIN)
        job_id, out = self.submit(
            "export DTRAIN_HIERARCHICAL_ALLREDUCE=1\n"
            f"{RUN} --verbose -- {PROBE} --elements 262144 || exit\n"
            f"{RUN} -- {PLAIN_TRAIN} --epochs {EPOCHS}\n", "-N", "2", "--ntasks-per-node=2")
        state, code, text = self.finish(job_id, out, timeout=90)
        self.assertEqual((state, code), ("COMPLETED", "0:0"), text)
        self.assertIn(f"dtrainrun: 4 ranks on {NODES[0]} (ranks 0-1), {NODES[1]} (ranks 2-3)",
                      text)
        self.assertIn("-launcher slurm", text)
        self.check_topology(rank_json(text, "topology"), text)
        for rank, a in rank_json(text, "allreduce").items():
            self.assertEqual(a["wrong"], 0, text)
            self.assertGreaterEqual(a["hierarchical_collectives"], 1, text)
        losses = [float(x) for x in re.findall(r"^\[0\]<stdout>:epoch +\d+ loss ([0-9.]+)",
                                               text, re.MULTILINE)]
        self.assertEqual(len(losses), EPOCHS, text)
        self.assertLess(losses[-1], 0.6 * losses[0], text)

    def test_srun_pmi2_two_nodes(self):
        self.need(PROBE)
        done = self.run_client(["srun", "--mpi=pmi2", "-N", "2", "--ntasks-per-node=2", PROBE,
                                "--elements", "4096"])
        self.assertEqual(done.returncode, 0, done.stderr)
        topology = {r["rank"]: r for r in plain_json(done.stdout) if r["probe"] == "topology"}
        self.check_topology(topology, done.stdout)

    def test_a_rank_failing_on_the_second_node(self):
        self.need(PROBE)
        job_id, out = self.submit(
            f"{RUN} -- {PROBE} --elements 64 --exit-rank 3 --exit-code 9\n", "-N", "2",
            "--ntasks-per-node=2")
        state, code, text = self.finish(job_id, out)
        self.assertEqual((state, code), ("FAILED", "9:0"), text)
        self.assertIn(f"dtrainrun: job failed: rank 3 on {NODES[1]} exited with code 9", text)


if __name__ == "__main__":
    sys.exit(main(nodes=2))
