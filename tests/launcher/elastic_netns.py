#!/usr/bin/env python3
"""Elastic training across hosts that come and go: three namespaced hosts (benchmarks/cluster/
netns_cluster.py), each with a local disk of its own for its commits and no shared filesystem,
and dtrainrun's elastic mode on host c (dtrainrun's own host cannot leave a job). examples/plain
trains with --elastic:
  1. world 0 trains on hosts a, b, c (rank 0 on a);
  2. every process of host a is killed and the discovery script stops offering it: world 1
     resumes on b and c from the newest commit they hold (a's disk is out of reach);
  3. the script offers a again: at its next commit world 1 stops for a resize, and world 2
     trains on b, c and a to the end.
Checked: each world resumes from the commit the one before it left (a resize loses no step),
every sample of every epoch is trained on exactly once in the history that counts (the steps a
failure rolled back excepted), and the final weights are bitwise those of a run that made the
same world changes at the same steps without a failure (the same layouts, started one after the
other with --stop-after-step). Measured and printed: from the kill to the first step on the
survivors (must be at most RECOVERY_LIMIT_S), and from the resize request to the first step of
the next world.

Exit status: 0 passed; 77 skipped where network namespaces are not permitted (not root, no `ip`,
or the kernel refuses) or no folder can stand for the local disks, a failure instead with
DTRAIN_TEST_REQUIRE_NETNS=1 (tools/run-tests.sh as root); anything else failed. Takes
15 to 40 s, most of it the ten seconds dtrainrun gives a failed world to end.
"""
import collections
import os
import re
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "benchmarks", "cluster"))
import netns_cluster  # noqa: E402

DTRAINRUN = os.environ["DTRAINRUN"]
PLAIN_TRAIN = os.environ["DTRAIN_TEST_PLAIN_TRAIN"]
SKIPPED = 77
RECOVERY_LIMIT_S = 30
WAIT_S = 45          # for any one thing the job should do next
REFERENCE_S = 60     # for each world of the reference run
SAMPLES = 1200
# world 3: 24 samples a step, 50 steps an epoch; world 2: 16, 75. Commits every 5 steps.
TRAINER = ["--epochs", "8", "--samples", str(SAMPLES), "--batch-size", "8",
           "--checkpoint-every", "5", "--keep-checkpoints", "2", "--seed", "3"]
STEP_DELAY_MS = "8"  # so that the test can change the hosts while a world trains


class Failure(Exception):
    pass


def check(condition, message):
    if not condition:
        raise Failure(message)


def local_disk_mount():
    """An empty folder of this machine that each host can mount its local disk on, or None."""
    for folder in ("/srv", "/mnt", "/media"):
        if os.path.isdir(folder):
            return folder
    return None


class Job:
    """A process whose output lines are kept with the time each arrived."""

    def __init__(self, argv, env):
        self.lines = []  # (monotonic time, line)
        self.changed = threading.Condition()
        self.process = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        text=True, errors="replace", start_new_session=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.process.stdout:
            with self.changed:
                self.lines.append((time.monotonic(), line.rstrip("\n")))
                self.changed.notify_all()
        with self.changed:
            self.changed.notify_all()

    def text(self):
        with self.changed:
            return "\n".join(line for _, line in self.lines)

    def wait_for(self, pattern, what, timeout_s=WAIT_S):
        """(time, match) of the first line matching `pattern`."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout_s
        with self.changed:
            while True:
                for at, line in self.lines:
                    m = regex.search(line)
                    if m:
                        return at, m
                left = deadline - time.monotonic()
                if left <= 0 or (self.process.poll() is not None and not self.reader.is_alive()):
                    raise Failure(f"waited in vain for {what} ({pattern!r}); the output so far:\n"
                                  f"{self.text()}")
                self.changed.wait(min(left, 0.5))

    def finish(self, timeout_s):
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise Failure(f"the job did not end within {timeout_s} s:\n{self.text()}") from None
        self.reader.join(timeout=5)
        return self.process.returncode


def job_environment():
    return {k: v for k, v in os.environ.items() if not k.startswith("DTRAIN_TEST_")}


def offer(path, hosts):
    with open(path + ".new", "w") as f:
        f.write("".join(f"{h.address}:1\n" for h in hosts))
    os.replace(path + ".new", path)


def layouts(text):
    """{generation: [host addresses in rank order]} from dtrainrun's notes."""
    out = {}
    for m in re.finditer(r"elastic: generation (\d+): \d+ ranks? on (.*)$", text, re.MULTILINE):
        out[int(m.group(1))] = re.findall(r"([0-9.]+) \(ranks?", m.group(2))
    return out


def world_starts(text):
    """[(generation, resumed step)] in order, from rank 0's lines: a resume line comes just before
    its world's 'generation G training on' line."""
    out, pending = [], 0
    for line in text.splitlines():
        m = re.search(r"^\[0\]<stdout>:resumed from the commit of step (\d+):", line)
        if m:
            pending = int(m.group(1))
        m = re.search(r"^\[0\]<stdout>:generation (\d+) training on", line)
        if m:
            out.append((int(m.group(1)), pending))
            pending = 0
    return out


def final_line(text):
    m = re.search(r"^\[0\]<stdout>:final: step (\d+) weights ([0-9a-f]+)$", text, re.MULTILINE)
    check(m is not None, f"no final line from rank 0:\n{text}")
    return int(m.group(1)), m.group(2)


def check_samples(records, starts, final_step):
    """Every epoch's samples exactly once, counting each world's steps up to the next world's
    start (steps after it were rolled back by a failure, and trained again)."""
    ends = {g: (starts[i + 1][1] if i + 1 < len(starts) else final_step)
            for i, (g, _) in enumerate(starts)}
    begins = dict(starts)
    seen = collections.defaultdict(collections.Counter)
    steps = collections.Counter()
    for name in sorted(os.listdir(records)):
        m = re.fullmatch(r"samples\.g(\d+)\.r(\d+)", name)
        check(m is not None, f"unexpected file {name} in {records}")
        g = int(m.group(1))
        with open(os.path.join(records, name)) as f:
            for line in f:
                if not line.endswith("\n"):
                    continue  # a killed rank's last line
                words = [int(w) for w in line.split()]
                step, epoch, indices = words[0], words[1], words[2:]
                if begins[g] < step <= ends[g]:
                    seen[epoch].update(indices)
                    steps[(g, step)] += 1
    epochs = sorted(seen)
    check(epochs == list(range(8)), f"epochs seen: {epochs}")
    for epoch in epochs:
        counts = seen[epoch]
        twice = [i for i, c in counts.items() if c > 1]
        missing = [i for i in range(SAMPLES) if i not in counts]
        check(not twice and not missing and len(counts) == SAMPLES,
              f"epoch {epoch}: samples seen twice {twice[:10]}, never {missing[:10]}")
    counted = sorted({step for _, step in steps})
    check(counted == list(range(1, final_step + 1)),
          f"the steps that count are not 1..{final_step}: {counted[:5]}...{counted[-5:]}")


def reference_run(cluster, env, world_layouts, starts, final_step, folder):
    """The same world changes at the same steps, without a failure: one plain dtrainrun job per
    world, each stopping (committing, exit 75) where the next world of the elastic run began. The
    worlds are separate dtrainruns, so they share a job name to resume each other's commits."""
    for i, (generation, _) in enumerate(starts):
        hosts = [cluster.host(a) for a in world_layouts[generation]]
        stop = ["--stop-after-step", str(starts[i + 1][1])] if i + 1 < len(starts) else []
        argv = cluster.on(2, [DTRAINRUN, "-H", cluster.host_list(1, hosts), "--launcher-agent",
                              cluster.agent, "--", PLAIN_TRAIN, "--elastic", "--job-name",
                              "reference", "--checkpoint-dir", folder, *TRAINER, *stop])
        try:
            done = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, errors="replace",
                                  timeout=REFERENCE_S)
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else e.stdout
            raise Failure(f"reference world {i} did not end within {REFERENCE_S} s:\n{out}") \
                from None
        expected = 75 if stop else 0
        check(done.returncode == expected,
              f"reference world {i} exited with {done.returncode}, not {expected}:\n{done.stdout}")
    return final_line(done.stdout)


def run(cluster, mount):
    a, b, c = cluster.hosts
    env = job_environment()
    hosts_file = os.path.join(cluster.folder, "hosts")
    offer(hosts_file, [a, b, c])
    # While `hold` exists the script does not answer: the test kills a host and takes it off
    # the list as one change, as a cluster manager that notices the death would. Otherwise
    # dtrainrun, which asks afresh as soon as a world fails, could see the dead host still
    # offered (and start the next world on it) in the moment between the kill and the edit.
    hold = os.path.join(cluster.folder, "hold")
    script = os.path.join(cluster.folder, "discover.sh")
    with open(script, "w") as f:
        f.write(f"#!/bin/sh\nwhile [ -e {hold} ]; do sleep 0.05; done\ncat {hosts_file}\n")
    os.chmod(script, 0o755)
    records = os.path.join(cluster.folder, "records")
    os.mkdir(records)
    commits = os.path.join(mount, "commits")

    job = Job(cluster.on(c, [
        DTRAINRUN, "--min-np", "2", "--max-np", "3", "--host-discovery-script", script,
        "--restarts", "2", "--blacklist-cooldown", "1", "--launcher-agent", cluster.agent, "--",
        PLAIN_TRAIN, "--elastic", "--checkpoint-dir", commits, *TRAINER, "--record-samples",
        records, "--step-delay-ms", STEP_DELAY_MS]), env)
    try:
        job.wait_for(r"^\[0\]<stdout>:epoch +2 loss", "world 0's second epoch")
        open(hold, "w").close()
        killed_at = time.monotonic()
        cluster.kill_processes([a])  # rank 0's host, with its disk
        offer(hosts_file, [b, c])
        os.remove(hold)
        failed_at, _ = job.wait_for(r"dtrainrun: restart 1 of 2", "the failure's restart")
        back_at, _ = job.wait_for(r"^\[0\]<stdout>:generation 1: step \d+ done on 2 ranks",
                                  "world 1's first step")
        recovery = back_at - killed_at

        offer(hosts_file, [b, c, a])
        offered_at = time.monotonic()
        asked_at, _ = job.wait_for(r"asking generation 1 to commit and stop", "the resize request")
        left_at, left = job.wait_for(r"^\[0\]<stdout>:generation 1: committed step (\d+); leaving",
                                     "world 1 leaving for the resize")
        grown_at, grown = job.wait_for(
            r"^\[0\]<stdout>:generation 2: step (\d+) done on 3 ranks", "world 2's first step")
        code = job.finish(WAIT_S * 2)
    finally:
        if job.process.poll() is None:
            cluster.kill_processes()
    text = job.text()
    check(code == 0, f"the elastic job exited with {code}:\n{text}")

    starts = world_starts(text)
    world_layouts = layouts(text)
    check([g for g, _ in starts] == [0, 1, 2], f"expected worlds 0, 1, 2; got {starts}:\n{text}")
    check(world_layouts[0] == [a.address, b.address, c.address] and
          sorted(world_layouts[1]) == [b.address, c.address] and len(world_layouts[2]) == 3,
          f"unexpected layouts {world_layouts}")
    resize_step = int(left.group(1))
    check(starts[2][1] == resize_step,
          f"world 2 resumed from step {starts[2][1]}, world 1 committed step {resize_step}")
    check(int(grown.group(1)) == resize_step + 1,
          f"world 2's first step is {grown.group(1)}, after the resize commit of {resize_step}")
    check(starts[1][1] > 0, f"world 1 started afresh: the survivors held no commit\n{text}")
    final_step, weights = final_line(text)
    check_samples(records, starts, final_step)
    print(f"worlds {world_layouts}; resumed from steps {[s for _, s in starts]}; "
          f"{final_step} steps; every sample once per epoch")
    print(f"failure: host {a.name} (rank 0) killed; dtrainrun restarted after "
          f"{failed_at - killed_at:.1f} s; first step on the survivors {recovery:.1f} s after "
          f"the kill (limit {RECOVERY_LIMIT_S} s)")
    print(f"resize: host offered again; dtrainrun asked after {asked_at - offered_at:.1f} s; "
          f"world 1 committed step {resize_step} and left {left_at - asked_at:.2f} s later; "
          f"world 2's first step (step {resize_step + 1}) {grown_at - left_at:.1f} s after that; "
          f"no step lost")
    check(recovery <= RECOVERY_LIMIT_S,
          f"training resumed {recovery:.1f} s after the host died, more than {RECOVERY_LIMIT_S} s")

    reference = reference_run(cluster, env, world_layouts, starts, final_step,
                              os.path.join(mount, "reference"))
    check(reference == (final_step, weights),
          f"the elastic job ended at step {final_step} with weights {weights}; the same world "
          f"changes without a failure: step {reference[0]}, weights {reference[1]}")
    print(f"the same world changes without a failure end with the same weights: {weights}")


def main():
    reason = netns_cluster.namespaces_unavailable()
    mount = local_disk_mount()
    if reason is None and mount is None:
        reason = "no folder (/srv, /mnt, /media) to mount each host's local disk on"
    if reason and os.environ.get("DTRAIN_TEST_REQUIRE_NETNS") == "1":
        print(f"FAILED: {reason}, but DTRAIN_TEST_REQUIRE_NETNS=1 says this machine provides "
              f"network namespaces")
        return 1
    if reason:
        print(f"SKIPPED: {reason}")
        return SKIPPED
    netns_cluster.install_signal_handlers()
    cluster = netns_cluster.Cluster(hosts=3, prefix="dtrain-elastic-", local_dir=mount)
    try:
        with cluster:
            run(cluster, mount)
        left = cluster.leftovers()
        check(not left, f"namespaces left behind: {left}")
    except (Failure, netns_cluster.ClusterError, subprocess.TimeoutExpired) as e:
        print(f"FAILED: {e}")
        return 1
    print("PASSED: a lost host, a resize, every sample once, and the weights of a run without "
          "the failure")
    return 0


if __name__ == "__main__":
    sys.exit(main())
