"""dtrainrun --cluster: every host runs the same command; the first host in sorted order starts
the job and the others wait and exit with its status. Two "hosts" on this machine: 127.0.0.1
(the leader) and 127.0.0.2, which the MPI launcher reaches through a local launcher agent."""
import concurrent.futures
import subprocess
import sys
import time
import unittest

from launcher_test_support import DTRAINRUN, PROGRAMS, clean_env, free_port, program

sys.path.insert(0, PROGRAMS)
import long_lines  # noqa: E402  (the test program's content(), to check its lines)

LEADER, FOLLOWER = "127.0.0.1", "127.0.0.2"


class Cluster(unittest.TestCase):
    def setUp(self):
        self.port = str(free_port())
        self.processes = []

    def tearDown(self):
        for p in self.processes:
            if p.poll() is None:
                p.kill()
            p.communicate()

    def start(self, host, *program_args, extra=(), hosts=f"{LEADER},{FOLLOWER}", env=None):
        env = env if env is not None else clean_env(DTRAIN_HOSTS=hosts, DTRAIN_CURRENT_HOST=host)
        p = subprocess.Popen([DTRAINRUN, "--cluster", "--slots", "2", "--cluster-port",
                              self.port, "--launcher-agent", program("local_agent.sh"), *extra,
                              "--", *program_args], env=env, stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.processes.append(p)
        return p

    @staticmethod
    def finish(p, timeout=120):
        out, err = p.communicate(timeout=timeout)
        return p.returncode, out, err

    @classmethod
    def finish_all(cls, *processes, timeout=120):
        with concurrent.futures.ThreadPoolExecutor(len(processes)) as pool:
            return list(pool.map(lambda p: cls.finish(p, timeout), processes))

    def test_both_hosts_exit_with_the_jobs_status(self):
        follower = self.start(FOLLOWER, program("exit_codes.py"))
        leader = self.start(LEADER, program("exit_codes.py"))
        code, out, err = self.finish(leader)
        self.assertEqual(code, 0, err)
        self.assertEqual(sorted(out.splitlines()),
                         [f"[{r}]<stdout>:rank {r} started" for r in range(4)])
        code, out, err = self.finish(follower)
        self.assertEqual(code, 0, err)
        # The follower prints the lines of the ranks on its host, for its log collector.
        self.assertEqual(sorted(out.splitlines()),
                         [f"[{r}]<stdout>:rank {r} started" for r in (2, 3)])
        self.assertIn(f"dtrainrun: {FOLLOWER} joined the job of leader {LEADER}; ranks 2-3 run "
                      f"here", err)

    def test_a_long_line_reaches_its_host_whole(self):
        # Rank 3 runs on the follower's host; its 3 MiB line travels to the follower in several
        # messages and must come out there as one line with one tag.
        size = 3 << 20
        args = (program("long_lines.py"), str(size), "10", "0")
        follower = self.start(FOLLOWER, *args)
        leader = self.start(LEADER, *args)
        # Both read at once: a follower whose stdout nobody reads stops reading the leader.
        (code, _, err), (follower_code, out, follower_err) = self.finish_all(leader, follower)
        self.assertEqual(code, 0, err[-2000:])
        self.assertEqual(follower_code, 0, follower_err[-2000:])
        for rank in (2, 3):
            mine = [line for line in out.splitlines() if line.startswith(f"[{rank}]")]
            self.assertEqual([len(line) for line in mine], [len(f"[{rank}]<stdout>:") + size,
                                                            len(f"[{rank}]<stdout>:after the "
                                                                f"long line from {rank}")])
            self.assertEqual(mine[0], f"[{rank}]<stdout>:"
                             + long_lines.content(rank, "stdout", size).decode())

    def test_a_failure_reaches_every_host(self):
        follower = self.start(FOLLOWER, program("exit_codes.py"), "3=3")
        leader = self.start(LEADER, program("exit_codes.py"), "3=3")
        for p in (leader, follower):
            code, out, err = self.finish(p)
            self.assertEqual(code, 3, err)
            self.assertIn("dtrainrun: job failed: rank 3 on", err)

    def test_sagemaker_variables(self):
        def env(current):
            return clean_env(SM_HOSTS=f'["{FOLLOWER}", "{LEADER}"]', SM_CURRENT_HOST=current,
                             SM_NUM_GPUS="1")
        # No --slots here: SM_NUM_GPUS gives one rank per host.
        follower = subprocess.Popen(
            [DTRAINRUN, "--cluster", "--cluster-port", self.port, "--launcher-agent",
             program("local_agent.sh"), "--", program("exit_codes.py"), "1=5"],
            env=env(FOLLOWER), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True)
        self.processes.append(follower)
        leader = subprocess.Popen(
            [DTRAINRUN, "--cluster", "--cluster-port", self.port, "--launcher-agent",
             program("local_agent.sh"), "--", program("exit_codes.py"), "1=5"],
            env=env(LEADER), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True)
        self.processes.append(leader)
        code, out, err = self.finish(leader)
        self.assertEqual(code, 5, err)
        self.assertEqual(sorted(out.splitlines()),
                         [f"[{r}]<stdout>:rank {r} started" for r in range(2)])
        code, out, err = self.finish(follower)
        self.assertEqual((code, out), (5, "[1]<stdout>:rank 1 started\n"), err)

    def test_the_leader_may_come_late(self):
        follower = self.start(FOLLOWER, program("exit_codes.py"))
        time.sleep(3)
        self.assertIsNone(follower.poll())
        leader = self.start(LEADER, program("exit_codes.py"))
        self.assertEqual(self.finish(leader)[0], 0)
        self.assertEqual(self.finish(follower)[0], 0)

    def test_restarts_are_announced_everywhere(self):
        follower = self.start(FOLLOWER, program("exit_codes.py"), "2=4", extra=["--restarts", "1"])
        leader = self.start(LEADER, program("exit_codes.py"), "2=4", extra=["--restarts", "1"])
        for p in (leader, follower):
            code, out, err = self.finish(p)
            self.assertEqual(code, 120, err)
            self.assertIn("dtrainrun: restart 1 of 1: rank 2 on", err)

    def test_a_leader_that_never_comes(self):
        follower = self.start(FOLLOWER, program("exit_codes.py"),
                              extra=["--cluster-timeout", "2"])
        code, out, err = self.finish(follower)
        self.assertEqual(code, 121, err)
        self.assertIn(f"dtrain: the leader {LEADER} did not answer on port {self.port} within "
                      f"2 s (last error: Connection refused); is `dtrainrun --cluster` running "
                      f"there", err)

    def test_a_follower_that_never_comes(self):
        leader = self.start(LEADER, program("exit_codes.py"), extra=["--cluster-timeout", "2"])
        code, out, err = self.finish(leader)
        self.assertEqual(code, 121, err)
        self.assertIn(f"dtrain: host(s) {FOLLOWER} did not connect to the leader {LEADER} on "
                      f"port {self.port} within 2 s", err)
        self.assertNotIn("started", out)

    def test_a_leader_that_goes_away(self):
        follower = self.start(FOLLOWER, program("exit_codes.py"), "0=hang", "1=hang", "2=hang",
                              "3=hang")
        leader = self.start(LEADER, program("exit_codes.py"), "0=hang", "1=hang", "2=hang",
                            "3=hang")
        seen = 0
        while seen < 2:  # both ranks on the follower's host are running
            line = follower.stdout.readline()
            self.assertNotEqual(line, "", "the follower ended early")
            seen += "started" in line
        leader.kill()
        code, out, err = self.finish(follower)
        self.assertEqual(code, 122, err)
        self.assertIn(f"dtrain: the leader {LEADER} went away before the job ended; its status "
                      f"is unknown", err)

    def test_a_single_host_cluster(self):
        leader = self.start(LEADER, program("exit_codes.py"), hosts=LEADER)
        code, out, err = self.finish(leader)
        self.assertEqual(code, 0, err)
        self.assertEqual(len(out.splitlines()), 2)


if __name__ == "__main__":
    unittest.main()
