"""Elastic mode's parts, without running a job: the discovery script's answers, the blacklist and
its cooldowns, the layout of a new world, the decisions between worlds (on a clock the test
moves), the notification server's wire format, and the options."""
import os
import shlex
import signal
import socket
import tempfile
import threading
import time
import unittest

from launcher_test_support import clean_env, dtrainrun, package_path, program, write_script

package_path()
from dtrain_launcher import elastic, elastic_run, options  # noqa: E402
from dtrain_launcher.elastic import (  # noqa: E402
    Blacklist, Continue, DiscoveryError, Elastic, Finish, Launch, Outcome, Settings, Wait,
    parse_discovery, plan_layout)
from dtrain_launcher.elastic_notify import NotifyServer, advertised_address  # noqa: E402
from dtrain_launcher.errors import LaunchError, UsageError  # noqa: E402
from dtrain_launcher.hosts import Host  # noqa: E402


def hosts(text):
    """'a:2,b:1' -> [Host('a', 2), Host('b', 1)]."""
    return [Host(n, int(s)) for n, s in (e.split(":") for e in text.split(",") if e)]


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


class DiscoveryAnswers(unittest.TestCase):
    def test_hosts_and_slots(self):
        self.assertEqual(parse_discovery("a:2\nb:1\n"), hosts("a:2,b:1"))
        # A bare host has the default slots; blank lines, comments, spaces and CRLF are fine.
        self.assertEqual(parse_discovery("# offered now\r\n\n  a  \r\nb:3 # big\n", 4),
                         hosts("a:4,b:3"))
        self.assertEqual(parse_discovery(""), [])
        self.assertEqual(parse_discovery("\n# nothing on offer\n"), [])

    def test_garbage_makes_the_whole_answer_unusable(self):
        cases = {
            "a:2\nTraceback (most recent call last):\n": "line 2: 'Traceback (most recent call "
                                                         "last):' is not host:slots",
            "a:2\nb:0\n": "line 2: host 'b' has 0 slots",
            "a:x\n": "line 1: host 'a' has slots 'x'",
            "a slots=2\n": "line 1: 'a slots=2' is not host:slots",
            "a:2\na:2\n": "line 2: host 'a' is listed twice",
            "a:1:2\n": "line 1: 'a:1:2' is not host or host:slots",
            "b\udcffad:1\n": "line 1: byte 0xff is not UTF-8 text",
            "a:99999999999999999999\n": "line 1: host 'a' has 99999999999999999999 slots; a "
                                        "host has 1 to 1048576",
            "-x:1\n": "line 1: '-x' is not a host name",
        }
        for text, message in cases.items():
            with self.subTest(text=text):
                with self.assertRaises(DiscoveryError) as caught:
                    parse_discovery(text)
                self.assertIn(message, str(caught.exception))

    def test_changes(self):
        self.assertEqual(elastic.describe_change(None, hosts("a:1")), "")
        self.assertEqual(elastic.describe_change(hosts("a:1,b:2"), hosts("a:1,b:2")), "")
        self.assertEqual(elastic.describe_change(hosts("a:1,b:2"), hosts("b:4,c:1")),
                         "+c:1, -a:1, b 2->4 slots")


class DiscoveryScript(unittest.TestCase):
    def setUp(self):
        folder = tempfile.TemporaryDirectory()
        self.addCleanup(folder.cleanup)
        self.dir = folder.name

    def script(self, body, name="discover.sh"):
        return write_script(os.path.join(self.dir, name), "#!/bin/sh\n" + body)

    def test_a_good_answer(self):
        path = self.script("echo a:2; echo b:2\n")
        self.assertEqual(elastic_run.run_script(path, 10), "a:2\nb:2\n")

    def test_a_hanging_script_is_killed_with_its_children(self):
        # The `sleep` keeps the script's output open: killing only the shell would still leave
        # the call waiting for it.
        path = self.script("echo a:1\nsleep 60\necho b:1\n")
        began = time.monotonic()
        with self.assertRaises(DiscoveryError) as caught:
            elastic_run.run_script(path, 0.5)
        self.assertLess(time.monotonic() - began, 5)
        self.assertEqual(str(caught.exception), "it did not finish within 0.5 s")

    def test_a_background_child_does_not_hold_the_call(self):
        # The child keeps the script's output open after the script printed and exited; the call
        # ends when the script does (Note [Discovery output]), and says so once.
        pids = os.path.join(self.dir, "pids")
        path = self.script(f"sleep 100 &\necho $! >> {pids}\necho a:2\n")

        def kill_children():
            with open(pids) as f:
                for pid in f.read().split():
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except ProcessLookupError:
                        pass
        self.addCleanup(kill_children)
        notes = []
        discovery = elastic_run.Discovery(path, 1, notes.append, timeout_s=10)
        began = time.monotonic()
        self.assertEqual(discovery.first(), [Host("a", 2)])
        self.assertEqual(discovery.again(), [Host("a", 2)])
        self.assertLess(time.monotonic() - began, 5)
        self.assertEqual(notes, [
            f"dtrainrun: elastic: the host discovery script {path} exited, but a process it "
            f"started (a command run in the background with &) still holds its output open; "
            f"dtrainrun takes what the script printed until it exited and does not wait for "
            f"that process. Redirect the command's output (command >/dev/null 2>&1 &) to keep "
            f"it off the script's answer"])
        # A background command that keeps off the output is nothing to tell.
        path = self.script(f"sleep 100 >/dev/null 2>&1 &\necho $! >> {pids}\necho b:1\n",
                           "quiet.sh")
        quiet = []
        self.assertEqual(elastic_run.Discovery(path, 1, quiet.append, timeout_s=10).first(),
                         [Host("b", 1)])
        self.assertEqual(quiet, [])

    def test_a_script_that_fails(self):
        path = self.script("echo a:1\necho 'the cloud API said 503' >&2\nexit 3\n")
        with self.assertRaises(DiscoveryError) as caught:
            elastic_run.run_script(path, 10)
        self.assertEqual(str(caught.exception),
                         "it exited with code 3; it said: the cloud API said 503")
        path = self.script("kill -TERM $$\n", "killed.sh")
        with self.assertRaisesRegex(DiscoveryError, r"^it was killed by signal 15 \(SIGTERM\)$"):
            elastic_run.run_script(path, 10)

    def test_a_script_without_its_first_line(self):
        path = write_script(os.path.join(self.dir, "plain"), "echo a:1\n")
        with self.assertRaisesRegex(DiscoveryError, r"^cannot start it: Exec format error \(a "
                                                    r"script needs a first line such as "
                                                    r"#!/bin/sh\)$"):
            elastic_run.run_script(path, 10)

    def test_a_script_that_never_stops_printing(self):
        path = self.script("exec cat /dev/zero\n")
        with self.assertRaisesRegex(DiscoveryError, r"^it printed more than 1 MiB$"):
            elastic_run.run_script(path, 30, max_bytes=1 << 20)

    def test_a_cancelled_call(self):
        path = self.script("sleep 60\n")
        cancel = threading.Event()
        threading.Timer(0.3, cancel.set).start()
        began = time.monotonic()
        with self.assertRaisesRegex(DiscoveryError, "^cancelled$"):
            elastic_run.run_script(path, 30, cancel)
        self.assertLess(time.monotonic() - began, 5)

    def test_first_call_fails_the_job_later_calls_are_told_once(self):
        flag = os.path.join(self.dir, "broken")
        path = self.script(f"if [ -e {flag} ]; then echo 'no answer' >&2; exit 1; fi\n"
                           f"echo a:2\n")
        notes = []
        discovery = elastic_run.Discovery(path, 1, notes.append)
        open(flag, "w").close()
        with self.assertRaises(LaunchError) as caught:
            discovery.first()
        self.assertEqual(caught.exception.exit_code, 121)
        self.assertEqual(str(caught.exception),
                         f"dtrain: elastic: the host discovery script {path} failed on its first "
                         f"call: it exited with code 1; it said: no answer; it must print "
                         f"host:slots lines and exit with 0")
        for _ in range(3):
            self.assertIsNone(discovery.again())
        os.remove(flag)
        self.assertEqual(discovery.again(), hosts("a:2"))
        self.assertEqual(notes, [
            "dtrainrun: elastic: the host discovery script failed: it exited with code 1; it "
            "said: no answer; keeping the hosts it offered last, and asking again",
            "dtrainrun: elastic: the host discovery script works again, after 3 failed call(s)"])

    def test_garbage_from_a_later_call_keeps_the_last_hosts(self):
        answer = os.path.join(self.dir, "answer")
        path = self.script(f"cat {answer}\n")
        with open(answer, "w") as f:
            f.write("a:2\n")
        notes = []
        discovery = elastic_run.Discovery(path, 1, notes.append)
        self.assertEqual(discovery.first(), hosts("a:2"))
        with open(answer, "w") as f:
            f.write("a:2\nERROR: quota exceeded\n")
        self.assertIsNone(discovery.again())
        self.assertEqual(notes, ["dtrainrun: elastic: the host discovery script failed: line 2: "
                                 "'ERROR: quota exceeded' is not host:slots; keeping the hosts it "
                                 "offered last, and asking again"])


class Cooldowns(unittest.TestCase):
    def test_doubling_up_to_the_cap(self):
        b = Blacklist(60)
        now = 0.0
        got = []
        for _ in range(8):
            cooldown, count = b.add("a", now)
            got.append((cooldown, count))
            self.assertTrue(b.is_out("a", now + cooldown - 1))
            self.assertFalse(b.is_out("a", now + cooldown))
            now += cooldown + 10  # back for 10 s, then it fails again: flapping
        self.assertEqual(got, [(60, 1), (120, 2), (240, 3), (480, 4), (960, 5), (1920, 6),
                               (1920, 7), (1920, 8)])

    def test_a_host_that_stayed_healthy_is_forgiven(self):
        b = Blacklist(60)
        self.assertEqual(b.add("a", 0), (60, 1))
        self.assertEqual(b.add("a", 60 + 100), (120, 2))
        # Back at 280; healthy for the longest cooldown (32 * 60 s): a fresh start.
        self.assertEqual(b.add("a", 280 + 1920), (60, 1))
        self.assertEqual(b.out(2200), {"a": 60})

    def test_hosts_are_independent_and_zero_turns_it_off(self):
        b = Blacklist(10)
        b.add("a", 0)
        self.assertFalse(b.is_out("b", 1))
        off = Blacklist(0)
        self.assertEqual(off.add("a", 0), (0.0, 0))
        self.assertFalse(off.is_out("a", 0))
        self.assertEqual(off.out(0), {})


class Layouts(unittest.TestCase):
    def test_first_world_in_the_scripts_order(self):
        self.assertEqual(plan_layout(None, hosts("b:2,a:2,c:4"), 6), hosts("b:2,a:2,c:2"))

    def test_survivors_keep_their_place_and_counts(self):
        before = hosts("a:2,b:2,c:2")
        # b left and nobody came: a keeps ranks 0-1, c follows.
        self.assertEqual(plan_layout(before, hosts("c:2,a:2"), 4), hosts("a:2,c:2"))
        # b left and d came: d takes b's place, so c keeps ranks 4-5.
        self.assertEqual(plan_layout(before, hosts("a:2,c:2,d:2"), 6), hosts("a:2,d:2,c:2"))
        # New hosts go to the end; a host whose slots grew gets more ranks only where needed.
        self.assertEqual(plan_layout(hosts("a:2"), hosts("e:2,a:4"), 5), hosts("a:4,e:1"))
        # Slots that shrank: the host keeps what it still has.
        self.assertEqual(plan_layout(before, hosts("a:1,b:2,c:2"), 5), hosts("a:1,b:2,c:2"))

    def test_the_same_hosts_give_the_same_layout(self):
        before = hosts("a:2,b:2")
        self.assertEqual(plan_layout(before, hosts("b:2,a:2,c:2"), 4), before)

    def test_fewer_ranks_than_kept(self):
        self.assertEqual(plan_layout(hosts("a:2,b:2"), hosts("a:2,b:2"), 3), hosts("a:2,b:1"))


def settings(**kwargs):
    values = dict(min_np=2, max_np=8, start_np=2, restarts=2, elastic_timeout_s=600,
                  cooldown_s=60)
    values.update(kwargs)
    return Settings(**values)


class Decisions(unittest.TestCase):
    def machine(self, offered="a:2,b:2", **kwargs):
        self.clock = Clock()
        m = Elastic(settings(**kwargs), self.clock)
        m.discovered(hosts(offered))
        return m

    def test_first_world(self):
        m = self.machine("a:2,b:2,c:8")
        step = m.next_world()
        self.assertIsInstance(step, Launch)
        self.assertEqual((step.generation, step.layout, step.restart_count),
                         (0, hosts("a:2,b:2,c:4"), 0))  # --max-np 8

    def test_fewer_than_min_np_forever(self):
        m = self.machine("a:1", elastic_timeout_s=30)
        step = m.next_world()
        self.assertIsInstance(step, Wait)
        self.assertEqual(step.message, "dtrainrun: elastic: waiting for 2 slots (--min-np 2): 1 "
                                       "available (a:1)")
        self.assertEqual(step.left_s, 30)
        self.clock.now += 29.5
        m.discovered(hosts("a:1"))
        self.assertEqual(m.next_world().left_s, 0.5)
        self.clock.now += 0.5
        step = m.next_world()
        self.assertIsInstance(step, Finish)
        self.assertEqual(step.code, 123)
        self.assertEqual(step.message, "dtrain: elastic: fewer than 2 slots (--min-np 2) for 30 s "
                                       "(--elastic-timeout): 1 available (a:1); exiting with 123")

    def test_slots_that_come_while_waiting(self):
        m = self.machine("", elastic_timeout_s=30)
        self.assertEqual(m.next_world().message,
                         "dtrainrun: elastic: waiting for 2 slots (--min-np 2): none available")
        self.clock.now += 20
        m.discovered(hosts("a:2"))
        step = m.next_world()
        self.assertIsInstance(step, Launch)
        self.assertEqual(step.layout, hosts("a:2"))
        # The timeout counts each wait afresh.
        m.ended(Outcome(3, "rank 0 on a exited with code 3", failed_rank=0))
        self.clock.now += 20
        self.assertEqual(m.next_world().left_s, 30)

    def test_first_world_waits_for_np_then_settles_for_min_np(self):
        m = self.machine("a:2", min_np=2, start_np=4, elastic_timeout_s=10)
        self.assertEqual(m.next_world().message,
                         "dtrainrun: elastic: waiting for 4 slots (-np 4): 2 available (a:2)")
        self.clock.now += 10
        step = m.next_world()
        self.assertIsInstance(step, Launch)
        self.assertEqual(step.layout, hosts("a:2"))
        self.assertEqual(step.note, "dtrainrun: elastic: 2 slots after waiting 10 s for 4 (-np); "
                                    "starting with them (--min-np 2)")

    def test_a_resize_uses_no_restart(self):
        m = self.machine("a:2,b:2", restarts=0)
        for generation in range(5):
            step = m.next_world()
            self.assertEqual((step.generation, step.restart_count), (generation, 0))
            self.assertIsNone(m.resize_target())  # nothing changed
            m.discovered(hosts("a:2" if generation % 2 == 0 else "a:2,b:2"))
            self.assertEqual(m.resize_target(), (generation + 1, 2 if generation % 2 == 0 else 4))
            verdict = m.ended(Outcome(75, "rank 0 on a exited with code 75", failed_rank=0))
            self.assertIsInstance(verdict, Continue)
            self.assertEqual(verdict.message,
                             f"dtrainrun: elastic: generation {generation} committed its state "
                             f"and stopped for a resize (resizes do not use --restarts)")
        self.assertEqual((m.failures, m.resizes), (0, 5))
        # With --restarts 0, the first failure ends the job with the rank's code.
        m.next_world()
        verdict = m.ended(Outcome(3, "rank 1 on a exited with code 3", failed_rank=1))
        self.assertEqual((verdict.code, verdict.message),
                         (3, "dtrainrun: job failed: rank 1 on a exited with code 3; exiting "
                             "with 3"))

    def test_a_resize_request_stands_and_follows_the_hosts(self):
        m = self.machine("a:2,b:2")
        m.next_world()
        m.discovered(hosts("a:2"))
        self.assertEqual(m.resize_target(), (1, 2))
        m.discovered(hosts("a:2,b:2"))  # b is back before the world stopped: still asked
        self.assertEqual(m.resize_target(), (1, 4))
        self.assertIsInstance(m.ended(Outcome(75, "", failed_rank=0)), Continue)

    def test_more_hosts_than_max_np_changes_nothing(self):
        m = self.machine("a:2,b:2", max_np=4)
        m.next_world()
        m.discovered(hosts("a:2,b:2,c:8"))
        self.assertIsNone(m.resize_target())
        m.discovered(hosts("a:2,c:8"))  # b left: c takes its place
        self.assertEqual(m.resize_target(), (1, 4))
        m.ended(Outcome(75, "", failed_rank=0))
        self.assertEqual(m.next_world().layout, hosts("a:2,c:2"))

    def test_exit_75_without_a_request_is_a_failure(self):
        m = self.machine()
        m.next_world()
        verdict = m.ended(Outcome(75, "rank 3 on b exited with code 75", failed_rank=3))
        self.assertEqual(verdict.message,
                         "dtrainrun: restart 1 of 2: rank 3 on b exited with code 75 (exit status "
                         "75 asks for a resize, but none was requested); b blacklisted for 60 s "
                         "(rank 3 failed there, its 1st failure in a row)")
        self.assertEqual(m.failures, 1)

    def test_budget_exhaustion(self):
        m = self.machine("a:1,b:1,c:1,d:1", restarts=2, cooldown_s=0)
        for failure in range(1, 3):
            self.assertEqual(m.next_world().restart_count, failure - 1)
            verdict = m.ended(Outcome(3, "rank 1 exited with code 3", failed_rank=1))
            self.assertIsInstance(verdict, Continue)
            self.assertEqual(verdict.message, f"dtrainrun: restart {failure} of 2: rank 1 exited "
                                              f"with code 3")
        self.assertEqual(m.next_world().restart_count, 2)
        verdict = m.ended(Outcome(9, "rank 0 exited with code 9", failed_rank=0))
        self.assertEqual((verdict.code, verdict.message),
                         (120, "dtrain: the job failed 3 times, the last time because rank 0 "
                               "exited with code 9; no restarts left (--restarts 2); exiting "
                               "with 120"))

    def test_a_flapping_host(self):
        m = self.machine("a:1,b:1,c:1", min_np=1, restarts=100, cooldown_s=60)
        out_for = []
        for _ in range(4):
            step = m.next_world()
            self.assertIn(Host("c", 1), step.layout)
            rank_on_c = [h.name for h in step.layout].index("c")
            verdict = m.ended(Outcome(1, "c failed", failed_rank=rank_on_c))
            self.assertIn("c blacklisted for", verdict.message)
            # Out of the next world until its cooldown ends, then back.
            began = self.clock.now
            self.assertNotIn("c", [h.name for h in m.next_world().layout])
            m.ended(Outcome(75, ""))  # not asked: a failure, blamed on rank 0's host a ...
            m.blacklist.bans.pop("a", None)  # ... which this test is not about
            while m.blacklist.is_out("c", self.clock.now):
                self.clock.now += 1
            out_for.append(self.clock.now - began)
            self.clock.now += 5  # back for 5 s, then it fails again
        self.assertEqual(out_for, [60, 120, 240, 480])

    def test_a_lost_host_is_blamed_not_the_survivor_that_noticed(self):
        m = self.machine("a:1,b:1,c:1", min_np=1)
        m.next_world()
        m.discovered(hosts("a:1,b:1"))  # c is gone; rank 0 noticed first and failed
        verdict = m.ended(Outcome(1, "rank 0 on a exited with code 1", failed_rank=0))
        self.assertEqual(verdict.message,
                         "dtrainrun: restart 1 of 2: rank 0 on a exited with code 1; c "
                         "blacklisted for 60 s (no longer offered by the discovery script, its "
                         "1st failure in a row)")
        self.assertEqual(m.next_world().layout, hosts("a:1,b:1"))
        # It comes back at once (flapping): kept out until its cooldown ends.
        m.discovered(hosts("a:1,b:1,c:1"))
        self.assertIsNone(m.resize_target())
        self.clock.now += 60
        self.assertEqual(m.resize_target(), (2, 3))

    def test_hosts_where_no_rank_started(self):
        m = self.machine("a:2,b:2,c:2", min_np=1)
        m.next_world()
        verdict = m.ended(Outcome(121, "rank(s) 2-3 did not start", never_started=[2, 3]))
        self.assertIn("b blacklisted for 60 s (its ranks did not start", verdict.message)
        # When no rank started anywhere, no host is to blame.
        m.next_world()
        verdict = m.ended(Outcome(121, "no rank started", never_started=[0, 1, 2, 3]))
        self.assertEqual(verdict.message, "dtrainrun: restart 2 of 2: no rank started")

    def test_timeout_after_blacklisting_names_the_last_failure(self):
        m = self.machine("a:1,b:1", min_np=2, elastic_timeout_s=5)
        m.next_world()
        m.ended(Outcome(3, "rank 1 on b exited with code 3", failed_rank=1))
        self.clock.now += 1
        self.assertIsInstance(m.next_world(), Wait)
        self.clock.now += 5
        step = m.next_world()
        self.assertEqual(step.message,
                         "dtrain: elastic: fewer than 2 slots (--min-np 2) for 5 s "
                         "(--elastic-timeout): 1 available (a:1); blacklisted after failures: b; "
                         "the last failure: rank 1 on b exited with code 3; exiting with 123")

    def test_success_and_interrupts(self):
        m = self.machine()
        m.next_world()
        self.assertEqual(m.ended(Outcome(0)).code, 0)
        m.next_world()
        verdict = m.ended(Outcome(130, "interrupted by SIGINT", interrupted=True))
        self.assertEqual((verdict.code, verdict.message),
                         (130, "dtrainrun: interrupted by SIGINT; exiting with 130"))
        self.assertEqual(m.failures, 0)
        m.next_world()
        self.assertEqual(m.ended(Outcome(0)).message, "dtrainrun: the job succeeded in "
                                                      "generation 2, after 0 resize(s) and 0 "
                                                      "restart(s)")


def ask(port, *lines, read=True):
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        for line in lines:
            s.sendall(line)
        if not read:
            return b""
        s.shutdown(socket.SHUT_WR)
        data = b""
        while True:
            chunk = s.recv(4096)
            if not chunk:
                return data
            data += chunk


class NotificationServer(unittest.TestCase):
    def setUp(self):
        self.server = NotifyServer(0)
        self.addCleanup(self.server.close)

    def test_wire_format(self):
        self.server.start_world(3, 8)
        self.assertEqual(ask(self.server.port, b"GEN\n"), b"GEN 3 8\n")
        self.assertEqual(self.server.stop_answers, 0)
        self.server.request_resize(4, 6)
        # Several requests on one connection, CRLF accepted.
        self.assertEqual(ask(self.server.port, b"GEN\n", b"GEN\r\n"), b"GEN 4 6\nGEN 4 6\n")
        self.assertEqual(self.server.stop_answers, 2)
        self.server.start_world(4, 6)
        self.assertEqual(ask(self.server.port, b"GEN\n"), b"GEN 4 6\n")

    def test_anything_else_is_refused(self):
        self.assertEqual(ask(self.server.port, b"HELLO\n", b"GEN\n"),
                         b"ERR unknown request; expected GEN\n")
        self.assertEqual(ask(self.server.port, b"G" * 100 + b"\n"), b"ERR request too long\n")
        self.assertEqual(ask(self.server.port, b"GEN"), b"ERR request too long\n")  # no newline

    def test_a_port_in_use(self):
        with self.assertRaises(LaunchError) as caught:
            NotifyServer(self.server.port)
        self.assertIn(f"dtrain: elastic mode cannot listen on port {self.server.port}: ",
                      str(caught.exception))
        self.assertEqual(caught.exception.exit_code, 121)

    def test_advertised_address(self):
        self.assertEqual(advertised_address(["127.0.0.1", "127.0.0.2", "localhost"]),
                         "127.0.0.1")
        self.assertEqual(advertised_address(["no-such-host.invalid", "127.0.0.2"]), "127.0.0.1")
        self.assertEqual(advertised_address(["no-such-host.invalid"]), socket.gethostname())


class Options(unittest.TestCase):
    def setUp(self):
        folder = tempfile.TemporaryDirectory()
        self.addCleanup(folder.cleanup)
        self.dir = folder.name
        self.script = write_script(os.path.join(self.dir, "discover.sh"), "#!/bin/sh\n")

    def test_elastic_options(self):
        o = options.parse(["--host-discovery-script", self.script, "--min-np", "2", "--max-np",
                           "8", "--elastic-timeout", "30", "--blacklist-cooldown", "0",
                           "--elastic-port", "4000", "--restarts", "3", "--", "p"])
        self.assertEqual((o.host_discovery_script, o.min_np, o.max_np, o.elastic_timeout_s,
                          o.blacklist_cooldown_s, o.elastic_port, o.restarts),
                         (self.script, 2, 8, 30.0, 0.0, 4000, 3))
        o = options.parse(["--host-discovery-script", self.script, "-np", "4", "p"])
        self.assertEqual((o.min_np, o.max_np, o.elastic_timeout_s, o.blacklist_cooldown_s,
                          o.elastic_port), (None, None, 600.0, 60.0, 0))
        o = options.parse(["--cluster", "--host-discovery-script", self.script, "--min-np", "1",
                           "p"])
        self.assertTrue(o.cluster)

    def test_a_script_on_path(self):
        o = options.parse(["--host-discovery-script", "true", "--min-np", "1", "p"])
        self.assertTrue(o.host_discovery_script.endswith(os.sep + "true"))

    def bad_arguments(self):
        plain = os.path.join(self.dir, "plain.txt")
        open(plain, "w").close()
        s = ["--host-discovery-script", self.script]
        return [
            (["--min-np", "2", "p"], "dtrain: --min-np applies to elastic mode only, which "
                                     "--host-discovery-script S turns on"),
            (["--elastic-timeout", "5", "p"], "dtrain: --elastic-timeout applies to elastic "
                                              "mode only"),
            (["--blacklist-cooldown", "5", "p"], "dtrain: --blacklist-cooldown applies to "
                                                 "elastic mode only"),
            (s + ["p"], "dtrain: elastic mode needs --min-np N, the fewest ranks the job runs "
                        "with (or -np N, which --min-np then defaults to)"),
            (s + ["--min-np", "4", "--max-np", "2", "p"],
             "dtrain: --min-np 4 is more than --max-np 2"),
            (s + ["-np", "4", "--max-np", "2", "p"], "dtrain: -np 4 is more than --max-np 2"),
            (s + ["--min-np", "2", "-np", "1", "p"],
             "dtrain: -np 1 is outside --min-np 2 to --max-np 1048576; in elastic mode -np is "
             "the size the first world waits for"),
            (s + ["--min-np", "0", "p"], "dtrain: --min-np 0: must be at least 1"),
            (s + ["--max-np", "1048577", "p"],
             "dtrain: --max-np 1048577: too large; --max-np accepts 1 to 1048576"),
            (s + ["--min-np", "1", "-H", "a:2", "p"],
             "dtrain: in elastic mode the hosts come from --host-discovery-script; drop "
             "-H/--hostfile"),
            (s + ["--min-np", "1", "--elastic-timeout", "0", "p"],
             "dtrain: --elastic-timeout 0: must be more than 0 seconds"),
            (s + ["--min-np", "1", "--elastic-timeout", "inf", "p"],
             "dtrain: --elastic-timeout expects seconds, got 'inf'"),
            (s + ["--min-np", "1", "--elastic-timeout", "nan", "p"],
             "dtrain: --elastic-timeout expects seconds, got 'nan'"),
            (s + ["--min-np", "1", "--elastic-timeout", "604801", "p"],
             "dtrain: --elastic-timeout 604801: at most 604800 seconds"),
            (s + ["--min-np", "1", "--blacklist-cooldown", "-1", "p"],
             "dtrain: --blacklist-cooldown -1: must be 0 or more seconds"),
            (s + ["--min-np", "1", "--blacklist-cooldown", "86401", "p"],
             "dtrain: --blacklist-cooldown 86401: at most 86400 seconds"),
            (s + ["--min-np", "1", "--elastic-port", "65536", "p"],
             "dtrain: --elastic-port 65536: ports go up to 65535"),
            (["--host-discovery-script", os.path.join(self.dir, "none"), "--min-np", "1", "p"],
             f"dtrain: --host-discovery-script '{os.path.join(self.dir, 'none')}': no such "
             f"file"),
            (["--host-discovery-script", plain, "--min-np", "1", "p"],
             f"dtrain: --host-discovery-script '{plain}': not an executable file"),
            (["--host-discovery-script", self.dir, "--min-np", "1", "p"],
             f"dtrain: --host-discovery-script '{self.dir}': not an executable file"),
            (["--host-discovery-script", "no-such-script-dtrain", "--min-np", "1", "p"],
             "dtrain: --host-discovery-script 'no-such-script-dtrain': not found on PATH; give "
             "its path (./no-such-script-dtrain if it is in this folder)"),
            (["--host-discovery-script", "--min-np", "1", "p"],
             "dtrain: --host-discovery-script needs a value"),
        ]

    def test_each_message(self):
        for argv, message in self.bad_arguments():
            with self.subTest(argv=argv):
                with self.assertRaises(UsageError) as caught:
                    options.parse(argv)
                self.assertIn(message, str(caught.exception))

    def test_refused_by_dtrainrun_before_anything_runs(self):
        marker = os.path.join(self.dir, "ran")
        for argv, message in self.bad_arguments():
            with self.subTest(argv=argv):
                done = dtrainrun(*argv[:-1], "--", program("touch_file.py"), marker, timeout=60)
                self.assertEqual((done.returncode, done.stdout), (2, ""), done.stderr)
                self.assertIn(message, done.stderr)
                self.assertFalse(os.path.exists(marker))


class DryRuns(unittest.TestCase):
    def setUp(self):
        folder = tempfile.TemporaryDirectory()
        self.addCleanup(folder.cleanup)
        self.dir = folder.name

    def script(self, body):
        return write_script(os.path.join(self.dir, "discover.sh"), "#!/bin/sh\n" + body)

    def test_the_first_worlds_command(self):
        script = self.script("echo node1:2; echo node2:4\n")
        done = dtrainrun("--dry-run", "--mpi", "mpich", "--host-discovery-script", script,
                         "--min-np", "2", "--max-np", "5", "--", program("touch_file.py"), "x")
        self.assertEqual(done.returncode, 0, done.stderr)
        argv = shlex.split(done.stdout)
        self.assertEqual(argv[1:6], ["-genvall", "-hosts", "node1:2,node2:3", "-n", "5"])

    def test_a_cluster_leader_gives_bare_hosts_its_slots(self):
        script = self.script("echo 127.0.0.1; echo 127.0.0.2\n")
        done = dtrainrun("--dry-run", "--mpi", "mpich", "--cluster", "--slots", "3",
                         "--host-discovery-script", script, "--min-np", "2", "--",
                         program("touch_file.py"), "x",
                         env=clean_env(DTRAIN_HOSTS="127.0.0.1,127.0.0.2",
                                       DTRAIN_CURRENT_HOST="127.0.0.1"))
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertEqual(shlex.split(done.stdout)[3:6], ["127.0.0.1:3,127.0.0.2:3", "-n", "6"])

    def test_open_mpi_is_given_the_elastic_variables(self):
        fake = write_script(os.path.join(self.dir, "mpirun"),
                            "#!/bin/sh\necho 'mpirun (Open MPI) 4.1.4'\n")
        script = self.script("echo node1:2\n")
        done = dtrainrun("--dry-run", "--mpi", "openmpi", "--launcher", fake,
                         "--host-discovery-script", script, "--min-np", "1", "--",
                         program("touch_file.py"), "x")
        self.assertEqual(done.returncode, 0, done.stderr)
        argv = shlex.split(done.stdout)
        self.assertEqual(argv[1:5], ["-np", "2", "-H", "node1:2"])
        for name in ("DTRAIN_ELASTIC", "DTRAIN_ELASTIC_GENERATION", "DTRAIN_ELASTIC_NOTIFY",
                     "DTRAINRUN_RESTART_COUNT"):
            self.assertIn(name, argv[argv.index("-x"):])

    def test_variables_of_an_outer_job_are_not_passed_on(self):
        from dtrain_launcher import mpi
        env = mpi.launch_environment({"DTRAIN_ELASTIC": "1", "DTRAIN_ELASTIC_NOTIFY": "h:1",
                                      "DTRAIN_ELASTIC_GENERATION": "4", "KEEP": "1"}, [], 0)
        self.assertEqual(env, {"KEEP": "1", "DTRAINRUN_RESTART_COUNT": "0"})

    def test_not_enough_slots(self):
        script = self.script("echo node1:1\n")
        done = dtrainrun("--dry-run", "--mpi", "mpich", "--host-discovery-script", script,
                         "--min-np", "2", "--", program("touch_file.py"), "x")
        self.assertEqual((done.returncode, done.stdout), (123, ""), done.stderr)
        self.assertIn("dtrainrun: elastic: waiting for 2 slots (--min-np 2): 1 available "
                      "(node1:1); --dry-run does not wait", done.stderr)

    def test_a_failing_script(self):
        script = self.script("echo 'no credentials' >&2; exit 2\n")
        done = dtrainrun("--dry-run", "--mpi", "mpich", "--host-discovery-script", script,
                         "--min-np", "2", "--", program("touch_file.py"), "x")
        self.assertEqual(done.returncode, 121, done.stderr)
        self.assertIn(f"dtrain: elastic: the host discovery script {script} failed on its first "
                      f"call: it exited with code 2; it said: no credentials", done.stderr)


if __name__ == "__main__":
    unittest.main()
