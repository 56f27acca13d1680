#!/usr/bin/env python3
"""The cluster benchmarks' footing: two namespaced hosts on a bridge, links shaped with tc.

benchmarks/cluster/ measures training across rate-limited links; its numbers mean something
only if the shaping really applies and a job really runs across the hosts. This checks both,
quickly:
  1. each qdisc the harness offers (tbf, htb) limits the link: one TCP stream each way carries
     the set rate within +-25% (unshaped, the same link carries several times more);
  2. examples/plain trains across the two shaped hosts, its loss falls, and its gradients
     crossed host A's link;
  3. nothing is left behind: no namespace, link or qdisc of the cluster after it closes.

Exit status: 0 passed; 77 skipped where network namespaces or tc shaping are not permitted
(not root, no `ip`/`tc`, or the kernel refuses); with DTRAIN_TEST_REQUIRE_NETNS=1 (tools/run-tests.sh
as root) missing namespaces are a failure instead; anything else failed.
"""
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "benchmarks", "cluster"))
import netns_cluster  # noqa: E402

DTRAINRUN = os.environ["DTRAINRUN"]
PLAIN_TRAIN = os.environ["DTRAIN_TEST_PLAIN_TRAIN"]
RATE_BPS = 200e6
TOLERANCE = 0.25
PROBE_SECONDS = 1.0
EPOCHS = 6
JOB_TIMEOUT_S = 60


class Failure(Exception):
    pass


def check(condition, message):
    if not condition:
        raise Failure(message)


def job_environment():
    # This test's own DTRAIN_TEST_* inputs are not dtrain settings; the ranks would warn.
    return {k: v for k, v in os.environ.items() if not k.startswith("DTRAIN_TEST_")}


def check_shaping(cluster):
    unshaped = cluster.measure_throughput(0, 1, PROBE_SECONDS)
    print(f"unshaped: {netns_cluster.format_rate(unshaped)}")
    check(unshaped > 2 * RATE_BPS,
          f"the unshaped link carries only {netns_cluster.format_rate(unshaped)}: too slow to "
          f"tell a shaped {netns_cluster.format_rate(RATE_BPS)} link from it")
    for qdisc in netns_cluster.QDISCS:
        cluster.shape(RATE_BPS, qdisc)
        for sender, receiver in ((0, 1), (1, 0)):
            got = cluster.measure_throughput(sender, receiver, PROBE_SECONDS)
            print(f"{qdisc} at {netns_cluster.format_rate(RATE_BPS)}: host {sender} -> host "
                  f"{receiver} carried {netns_cluster.format_rate(got)} ({got / RATE_BPS:.2f}x)")
            check(abs(got / RATE_BPS - 1) <= TOLERANCE,
                  f"{qdisc} shaping to {netns_cluster.format_rate(RATE_BPS)} did not apply: "
                  f"the link carried {netns_cluster.format_rate(got)}\n"
                  + "\n".join(cluster.qdisc_lines(sender)))


def check_training(cluster):
    before = cluster.link_bytes(0)
    argv = cluster.on(0, [DTRAINRUN, "-H", cluster.host_list(1), "--launcher-agent",
                          cluster.agent, "--", PLAIN_TRAIN, "--epochs", str(EPOCHS)])
    try:
        done = subprocess.run(argv, env=job_environment(), stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              errors="replace", timeout=JOB_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        raise Failure(f"the training job did not finish within {JOB_TIMEOUT_S} s\n"
                      f"{e.stdout}\n{e.stderr}") from None
    check(done.returncode == 0, f"the training job exited with {done.returncode}\n--- stdout\n"
                                f"{done.stdout}\n--- stderr\n{done.stderr}")
    losses = [float(x) for x in re.findall(r"^\[0\]<stdout>:epoch +\d+ loss ([0-9.]+)",
                                           done.stdout, re.MULTILINE)]
    check(len(losses) == EPOCHS, f"expected {EPOCHS} epoch lines from rank 0:\n{done.stdout}")
    check(losses[-1] < 0.6 * losses[0], f"the loss did not fall: {losses}")
    crossed = [y - x for x, y in zip(before, cluster.link_bytes(0))]
    check(min(crossed) > 0, f"training moved {crossed} bytes over host A's link")
    print(f"training across 2 shaped hosts: loss {losses[0]:.4f} -> {losses[-1]:.4f}; host A's "
          f"link received {crossed[0]} bytes, sent {crossed[1]} bytes")


def main():
    reason = netns_cluster.namespaces_unavailable()
    if reason and os.environ.get("DTRAIN_TEST_REQUIRE_NETNS") == "1":
        print(f"FAILED: {reason}, but DTRAIN_TEST_REQUIRE_NETNS=1 says this machine provides "
              f"network namespaces")
        return 1
    # Shaping stays a skip: it needs the kernel's tbf and htb qdiscs, which no package provides.
    reason = reason or netns_cluster.shaping_unavailable("tbf")
    reason = reason or netns_cluster.shaping_unavailable("htb")
    if reason:
        print(f"SKIPPED: {reason}")
        return netns_cluster.SKIPPED
    netns_cluster.install_signal_handlers()
    cluster = netns_cluster.Cluster(hosts=2)
    try:
        with cluster:
            check_shaping(cluster)
            check_training(cluster)
        left = cluster.leftovers()
        check(not left, f"namespaces left behind: {left}")
    except (Failure, netns_cluster.ClusterError, subprocess.TimeoutExpired) as e:
        print(f"FAILED: {e}")
        return 1
    print("PASSED: shaped links between namespaced hosts, and a job across them")
    return 0


if __name__ == "__main__":
    sys.exit(main())
