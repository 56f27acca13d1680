"""Elastic jobs run through dtrainrun and MPICH's launcher: a discovery script whose answer the
test rewrites drives resizes, and a stand-in rank program (programs/elastic_rank.py) plays the
ranks' side of the notification protocol, commits a step count and resumes from it. The "hosts"
are 127.0.0.1, 127.0.0.2 and 127.0.0.3, all this machine, reached through a local launcher
agent, as in test_cluster."""
import os
import re
import signal
import subprocess
import tempfile
import time
import unittest

from launcher_test_support import DTRAINRUN, clean_env, free_port, program, write_script

A, B, C = "127.0.0.1", "127.0.0.2", "127.0.0.3"
WAIT_S = 60


class ElasticJob(unittest.TestCase):
    def setUp(self):
        folder = tempfile.TemporaryDirectory()
        self.addCleanup(folder.cleanup)
        self.dir = folder.name
        self.state = os.path.join(self.dir, "state")
        os.makedirs(self.state)
        self.offered = os.path.join(self.dir, "offered")
        self.broken = os.path.join(self.dir, "broken")
        self.script = write_script(
            os.path.join(self.dir, "discover.sh"),
            f"#!/bin/sh\nif [ -e {self.broken} ]; then echo 'no answer' >&2; exit 1; fi\n"
            f"cat {self.offered}\n")
        self.processes = []

    def tearDown(self):
        for p, out, err in self.processes:
            if p.poll() is None:
                p.kill()
            p.wait()
            out.close()
            err.close()

    def offer(self, *entries):
        """What the discovery script prints from now on (replaced whole, never read half)."""
        with open(self.offered + ".new", "w") as f:
            f.write("".join(e + "\n" for e in entries))
        os.replace(self.offered + ".new", self.offered)

    def start(self, *args, deaf=False, env=None, name="dtrainrun"):
        out = open(os.path.join(self.dir, f"{name}.out"), "w+")
        err = open(os.path.join(self.dir, f"{name}.err"), "w+")
        argv = [DTRAINRUN, "--verbose", "--host-discovery-script", self.script,
                "--launcher-agent", program("local_agent.sh"), *args, "--",
                program("elastic_rank.py"), self.state] + (["--deaf"] if deaf else [])
        p = subprocess.Popen(argv, env=env or clean_env(), stdin=subprocess.DEVNULL, stdout=out,
                             stderr=err)
        self.processes.append((p, out, err))
        return p

    def text(self, name):
        with open(os.path.join(self.dir, name)) as f:
            return f.read()

    def log(self):
        """The ranks' log: (event, {field: value}) in order."""
        try:
            with open(os.path.join(self.state, "log")) as f:
                lines = f.read().splitlines()
        except FileNotFoundError:
            return []
        return [(line.split()[0], dict(w.split("=", 1) for w in line.split()[1:]))
                for line in lines]

    def started(self, generation):
        return sorted((int(f["rank"]), int(f["size"]), f["restart_count"], int(f["step"]))
                      for e, f in self.log() if e == "start" and f["gen"] == str(generation))

    def check_job_identity(self, generations):
        """Every rank of every world has the job's one DTRAINRUN_JOB_ID, and its generation as
        DTRAINRUN_ATTEMPT: each world is one more launch (Note [Job identity] in mpi.py)."""
        starts = [f for e, f in self.log() if e == "start"]
        self.assertEqual(sorted({int(f["gen"]) for f in starts}), list(range(generations)))
        self.assertEqual([f["attempt"] for f in starts], [f["gen"] for f in starts])
        self.assertEqual(len({f["job"] for f in starts}), 1, starts)
        self.assertRegex(starts[0]["job"], r"^[0-9]{8}-[0-9]{6}-[0-9]+-[0-9a-f]{8}$")

    def wait_until(self, what, condition, name="dtrainrun"):
        deadline = time.monotonic() + WAIT_S
        while not condition():
            if time.monotonic() > deadline:
                self.fail(f"waited {WAIT_S} s for {what}; log: {self.log()}\n"
                          f"stderr: {self.text(name + '.err')[-3000:]}")
            time.sleep(0.1)

    def wait_for_world(self, generation, size):
        self.wait_until(f"generation {generation} of {size} ranks",
                        lambda: len(self.started(generation)) == size)

    def wait_for_note(self, note, name="dtrainrun"):
        self.wait_until(repr(note), lambda: note in self.text(name + ".err"), name)

    def order(self, generation, **codes):
        """Ends ranks of `generation`: order(0, r2=3, r0=0)."""
        for rank, how in codes.items():
            with open(os.path.join(self.state, f"exit.{generation}.{rank[1:]}"), "w") as f:
                f.write(str(how))

    def finish(self, p, name="dtrainrun"):
        open(os.path.join(self.state, "finish"), "w").close()
        p.wait(timeout=WAIT_S)
        return p.returncode, self.text(name + ".err")

    def commands(self, err):
        """-hosts and -n of every launcher command dtrainrun ran (--verbose)."""
        return re.findall(r"dtrainrun: running \S+ -genvall -hosts (\S+) -n (\d+) ", err)


class Resizes(ElasticJob):
    def test_shrink_then_grow_without_using_restarts(self):
        self.offer(f"{A}:2", f"{B}:2")
        p = self.start("--min-np", "2", "--max-np", "3", "--restarts", "0")
        self.wait_for_world(0, 3)
        self.offer(f"{A}:2")  # B is taken away
        self.wait_for_world(1, 2)
        self.offer(f"{A}:2", f"{C}:1")  # C comes
        self.wait_for_world(2, 3)
        code, err = self.finish(p)
        self.assertEqual(code, 0, err)
        self.assertEqual(self.commands(err), [(f"{A}:2,{B}:1", "3"), (f"{A}:2", "2"),
                                              (f"{A}:2,{C}:1", "3")])
        for note in (f"dtrainrun: elastic: generation 0: 3 ranks on {A} (ranks 0-1), {B} "
                     f"(rank 2)",
                     f"dtrainrun: elastic: hosts changed: -{B}:2",
                     "dtrainrun: elastic: asking generation 0 to commit and stop for a resize; "
                     "the next world would have 2 ranks",
                     "dtrainrun: elastic: generation 0 committed its state and stopped for a "
                     "resize (resizes do not use --restarts)",
                     f"dtrainrun: elastic: generation 1: 2 ranks on {A} (ranks 0-1)",
                     f"dtrainrun: elastic: hosts changed: +{C}:1",
                     f"dtrainrun: elastic: generation 2: 3 ranks on {A} (ranks 0-1), {C} "
                     f"(rank 2)",
                     "dtrainrun: the job succeeded in generation 2, after 2 resize(s) and 0 "
                     "restart(s)"):
            self.assertIn(note, err)
        self.assertNotIn("restart 1", err)
        # Every world resumed from the step rank 0 committed before the resize; every rank of a
        # world that was asked to stop exited with 75, and no restart was counted.
        exits = [(f["gen"], f["code"]) for e, f in self.log() if e == "exit"]
        self.assertEqual(sorted(exits), [("0", "75")] * 3 + [("1", "75")] * 2 + [("2", "0")] * 3)
        resumed = {g: {s[3] for s in self.started(g)} for g in (0, 1, 2)}
        self.assertEqual(resumed[0], {0})
        self.assertEqual(len(resumed[1]), 1)
        self.assertGreater(min(resumed[1]), 0)
        self.assertGreater(min(resumed[2]), min(resumed[1]))
        self.assertEqual({s[2] for g in (0, 1, 2) for s in self.started(g)}, {"0"})
        self.check_job_identity(3)

    def test_exit_75_that_was_not_asked_for_is_a_failure(self):
        self.offer(f"{A}:1", f"{B}:1")
        p = self.start("--min-np", "2")
        self.wait_for_world(0, 2)
        self.order(0, r1=75, r0=0)
        p.wait(timeout=WAIT_S)
        err = self.text("dtrainrun.err")
        self.assertEqual(p.returncode, 75, err)
        self.assertRegex(err, r"dtrainrun: job failed: rank 1 on \S+ exited with code 75 \(exit "
                              r"status 75 asks for a resize, but none was requested\); exiting "
                              r"with 75")


class Failures(ElasticJob):
    def test_a_failing_host_is_blacklisted_and_the_budget_runs_out(self):
        self.offer(f"{A}:1", f"{B}:1", f"{C}:1")
        p = self.start("--min-np", "2", "--restarts", "1", "--blacklist-cooldown", "3600")
        self.wait_for_world(0, 3)
        self.order(0, r2=3, r0=0, r1=0)  # rank 2 runs on C
        self.wait_for_world(1, 2)
        self.assertEqual(self.started(1), [(0, 2, "1", self.started(1)[0][3]),
                                           (1, 2, "1", self.started(1)[0][3])])
        err = self.text("dtrainrun.err")
        self.assertRegex(err, rf"dtrainrun: restart 1 of 1: rank 2 on \S+ exited with code 3; "
                              rf"{C} blacklisted for 3600 s \(rank 2 failed there, its 1st "
                              rf"failure in a row\)\n")
        self.order(1, r1=4, r0=0)
        p.wait(timeout=WAIT_S)
        err = self.text("dtrainrun.err")
        self.assertEqual(p.returncode, 120, err)
        self.assertEqual(self.commands(err), [(f"{A}:1,{B}:1,{C}:1", "3"), (f"{A}:1,{B}:1", "2")])
        self.assertRegex(err, r"dtrain: the job failed 2 times, the last time because rank 1 on "
                              r"\S+ exited with code 4; no restarts left \(--restarts 1\); "
                              r"exiting with 120\n")

    def test_a_blacklisted_host_returns_after_its_cooldown(self):
        self.offer(f"{A}:1", f"{B}:1")
        p = self.start("--min-np", "1", "--restarts", "1", "--blacklist-cooldown", "2")
        self.wait_for_world(0, 2)
        self.order(0, r1=3, r0=0)
        self.wait_for_world(1, 1)
        self.wait_for_world(2, 2)  # B's cooldown ended: a resize, not a restart
        code, err = self.finish(p)
        self.assertEqual(code, 0, err)
        self.assertEqual(self.commands(err), [(f"{A}:1,{B}:1", "2"), (f"{A}:1", "1"),
                                              (f"{A}:1,{B}:1", "2")])
        self.assertIn(f"{B} blacklisted for 2 s (rank 1 failed there, its 1st failure in a row)",
                      err)
        self.assertIn("dtrainrun: elastic: generation 1 committed its state and stopped for a "
                      "resize", err)
        self.assertIn("dtrainrun: the job succeeded in generation 2, after 1 resize(s) and 1 "
                      "restart(s)", err)
        self.assertEqual([s[2] for s in self.started(2)], ["1", "1"])
        self.check_job_identity(3)  # a restart (world 1), then a resize (world 2)

    def test_a_lost_host_is_blamed_not_the_rank_that_noticed(self):
        # Ranks that do not ask (a program without elastic support) keep running after the
        # hosts changed; then C is lost and the ranks fail.
        self.offer(f"{A}:1", f"{B}:1", f"{C}:1")
        p = self.start("--min-np", "1", "--restarts", "1", deaf=True)
        self.wait_for_world(0, 3)
        self.offer(f"{A}:1", f"{B}:1")
        self.wait_for_note(f"dtrainrun: elastic: hosts changed: -{C}:1")
        self.order(0, r0=1, r1=1, r2=1)
        self.wait_for_world(1, 2)
        code, err = self.finish(p)
        self.assertEqual(code, 0, err)
        self.assertRegex(err, rf"dtrainrun: restart 1 of 1: rank \d on \S+ exited with code 1; "
                              rf"{C} blacklisted for 60 s \(no longer offered by the discovery "
                              rf"script, its 1st failure in a row\)\n")
        self.assertEqual(self.commands(err)[1], (f"{A}:1,{B}:1", "2"))


class Waiting(ElasticJob):
    def test_fewer_than_min_np_slots_until_the_timeout(self):
        self.offer(f"{A}:1")
        p = self.start("--min-np", "2", "--elastic-timeout", "2")
        p.wait(timeout=WAIT_S)
        err = self.text("dtrainrun.err")
        self.assertEqual(p.returncode, 123, err)
        self.assertIn(f"dtrainrun: elastic: waiting for 2 slots (--min-np 2): 1 available "
                      f"({A}:1); waiting up to 2 s more\n", err)
        self.assertIn(f"dtrain: elastic: fewer than 2 slots (--min-np 2) for 2 s "
                      f"(--elastic-timeout): 1 available ({A}:1); exiting with 123\n", err)
        self.assertEqual(self.log(), [])

    def test_slots_that_come_while_waiting(self):
        self.offer()
        p = self.start("--min-np", "2")
        self.wait_for_note("dtrainrun: elastic: waiting for 2 slots (--min-np 2): none "
                           "available")
        self.offer(f"{A}:1", f"{B}:1")
        self.wait_for_world(0, 2)
        code, err = self.finish(p)
        self.assertEqual(code, 0, err)

    def test_an_interrupt_while_waiting(self):
        self.offer()
        p = self.start("--min-np", "1")
        self.wait_for_note("dtrainrun: elastic: waiting for 1 slot (--min-np 1)")
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=WAIT_S)
        err = self.text("dtrainrun.err")
        self.assertEqual(p.returncode, 143, err)
        self.assertIn("dtrainrun: interrupted by SIGTERM while waiting for hosts; exiting with "
                      "143", err)


class Discovery(ElasticJob):
    def test_a_first_call_that_fails_ends_the_job(self):
        open(self.broken, "w").close()
        p = self.start("--min-np", "1")
        p.wait(timeout=WAIT_S)
        err = self.text("dtrainrun.err")
        self.assertEqual(p.returncode, 121, err)
        self.assertEqual(err.splitlines()[-1],
                         f"dtrain: elastic: the host discovery script {self.script} failed on "
                         f"its first call: it exited with code 1; it said: no answer; it must "
                         f"print host:slots lines and exit with 0")
        self.assertEqual(self.log(), [])

    def test_later_failures_keep_the_job_running(self):
        self.offer(f"{A}:1", f"{B}:1")
        p = self.start("--min-np", "1")
        self.wait_for_world(0, 2)
        open(self.broken, "w").close()
        self.wait_for_note("dtrainrun: elastic: the host discovery script failed: it exited "
                           "with code 1; it said: no answer; keeping the hosts it offered last, "
                           "and asking again")
        os.remove(self.broken)
        self.wait_for_note("dtrainrun: elastic: the host discovery script works again, after ")
        code, err = self.finish(p)
        self.assertEqual(code, 0, err)
        self.assertEqual(err.count("the host discovery script failed"), 1)
        self.assertEqual(len(self.commands(err)), 1)  # no resize, no restart


class ManagedCluster(ElasticJob):
    def test_a_follower_that_gets_ranks_in_a_later_world(self):
        # The leader (A) offers only itself at first; the follower (B) waits with no ranks,
        # then B is offered and its ranks' lines reach it.
        port = str(free_port())
        self.offer(f"{A}:1")

        def env(current):
            return clean_env(DTRAIN_HOSTS=f"{A},{B}", DTRAIN_CURRENT_HOST=current)
        follower = self.start("--cluster", "--cluster-port", port, "--min-np", "1",
                              env=env(B), name="follower")
        leader = self.start("--cluster", "--cluster-port", port, "--min-np", "1",
                            env=env(A), name="leader")
        self.wait_for_world(0, 1)
        self.wait_for_note(f"dtrainrun: {B} joined the job of leader {A}", "follower")
        self.offer(f"{A}:1", f"{B}:1")
        self.wait_for_world(1, 2)
        code, err = self.finish(leader, "leader")
        self.assertEqual(code, 0, err)
        follower.wait(timeout=WAIT_S)
        follower_err = self.text("follower.err")
        self.assertEqual(follower.returncode, 0, follower_err)
        self.assertRegex(self.text("follower.out"),
                         r"^\[1\]<stdout>:rank 1 of 2 in generation 1 from step \d+\n$")
        self.assertIn(f"dtrainrun: elastic: generation 1: 2 ranks on {A} (rank 0), {B} "
                      f"(rank 1)", follower_err)


if __name__ == "__main__":
    unittest.main()
