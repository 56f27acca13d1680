#!/usr/bin/env python3
"""A 2-host x 2-slot dtrain job across two network namespaces joined by a bridge.

Each "host" is its own network, UTS (host name), IPC and mount namespace with its own /dev/shm
and boot id: MPICH and UCX decide that two processes share a machine from the host name, the
boot id and the IPC namespace, so anything less lets them talk through shared memory and the
job never touches the network (Note [Two hosts on one machine] in
benchmarks/cluster/netns_cluster.py, which makes the hosts for this test and for the cluster
benchmarks). dtrainrun runs on host A; MPICH's Hydra reaches host B through a launcher agent
that enters B's namespaces, in a clean environment like ssh would give, instead of ssh. The
test checks:
  1. variables: DTRAIN_* settings and -x variables reach the ranks on both hosts;
  2. topology and hierarchical allreduce: local/cross ranks of all four ranks, a 16 MiB
     allreduce with DTRAIN_HIERARCHICAL_ALLREDUCE=1 that is exact and ran hierarchically, and the
     byte counters of host A's link proving that the data crossed it;
  3. the host library (Note [Choosing the host library]): without hierarchical allreduce, the
     default DTRAIN_CPU_OPERATIONS=auto carries the probe's allreduce over Gloo across the two
     machines, and over MPI on every rank, with a warning, where Gloo cannot connect;
  4. training: examples/plain learns across the two hosts;
  5. managed-cluster mode: `dtrainrun --cluster` on both hosts, the follower on host B printing
     its own ranks' output and exiting with the job's status.

Exit status: 0 passed; 77 network namespaces are not permitted here (not root, no `ip`, or the
kernel refuses): the same job then runs with DTRAIN_HOST_ID emulation on one machine, and the
test reports itself skipped (ctest SKIP_RETURN_CODE), because the network was not tested; any
other status is a failure. DTRAIN_TEST_NO_NETNS=1 takes the emulation path on purpose;
DTRAIN_TEST_REQUIRE_NETNS=1 (tools/run-tests.sh as root) makes missing namespaces a failure.

Note [Finalize over TCP]
The jobs here are the ones that showed MPICH/UCX hanging in MPI_Finalize across hosts; dtrain
settles a multi-host job before it finalizes MPI (include/dtrain/runtime/detail/session_impl.hpp, Note
[Finalize over TCP]). A job that still hangs there is reported as such, with its output.
"""
import json
import os
import re
import socket
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "benchmarks", "cluster"))
import netns_cluster  # noqa: E402

DTRAINRUN = os.environ["DTRAINRUN"]
PROBE = os.environ["DTRAIN_TEST_PROBE"]
PLAIN_TRAIN = os.environ["DTRAIN_TEST_PLAIN_TRAIN"]
ENV_REPORT = os.path.join(HERE, "programs", "env_report.py")
EMULATE = os.path.join(HERE, "programs", "emulated_host.sh")
LOCAL_AGENT = os.path.join(HERE, "programs", "local_agent.sh")
SKIPPED = 77
SLOTS = 2
ELEMENTS = 4 << 20  # floats: 16 MiB
TIMEOUT_S = 240
EPOCHS = 6


class Failure(Exception):
    pass


def check(condition, message):
    if not condition:
        raise Failure(message)


def run(argv, env=None, timeout=TIMEOUT_S):
    done = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, timeout=timeout, check=False, text=True,
                          errors="replace")
    return done


JOB_TIMEOUT_S = 120


def run_job(argv, env, what, finished):
    """Runs one dtrainrun job. `finished(stdout)` says whether the output shows the job's work
    done, which tells a job that hung at exit from one that hung working."""
    try:
        done = run(argv, env=env, timeout=JOB_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else e.stdout or ""
        if finished(out):
            raise Failure(
                f"{what} did its work but did not exit within {JOB_TIMEOUT_S} s: its ranks hang in "
                f"MPI_Finalize (Note [Finalize over TCP])\n{out}") from None
        raise Failure(f"{what} did not finish within {JOB_TIMEOUT_S} s\n{out}") from None
    require(done, what)
    return done


def require(done, what):
    check(done.returncode == 0, f"{what} exited with {done.returncode}\n--- stdout\n{done.stdout}"
                                f"\n--- stderr\n{done.stderr}")


def rank_json(stdout, probe):
    out = {}
    for line in stdout.splitlines():
        m = re.match(r"^\[(\d+)\]<stdout>:(\{.*\})$", line)
        if m:
            record = json.loads(m.group(2))
            if record.get("probe") == probe:
                out[int(m.group(1))] = record
    return out


def namespaces_unavailable():
    if os.environ.get("DTRAIN_TEST_NO_NETNS") == "1":
        return "DTRAIN_TEST_NO_NETNS=1"
    return netns_cluster.namespaces_unavailable()


def link_bytes(cluster):
    """(received, sent) bytes over host A's link."""
    return list(cluster.link_bytes(0))


def probe_finished(stdout):
    return len(rank_json(stdout, "allreduce")) == 2 * SLOTS


def training_finished(stdout):
    return re.search(rf"^\[0\]<stdout>:epoch +{EPOCHS} loss", stdout, re.MULTILINE) is not None


def check_variables(stdout, where):
    reports = {}
    for line in stdout.splitlines():
        m = re.match(r"^\[(\d+)\]<stdout>:(\{.*\})$", line)
        if m:
            reports[int(m.group(1))] = json.loads(m.group(2))["env"]
    check(sorted(reports) == [0, 1, 2, 3], f"{where}: env reports from ranks {sorted(reports)}")
    for rank, env in reports.items():
        check(env == {"DTRAIN_HIERARCHICAL_ALLREDUCE": "1", "LAUNCHER_TEST_MARK": "forwarded"},
              f"{where}: rank {rank} sees {env}")


def check_probe(stdout, host_of_rank, where):
    topology = rank_json(stdout, "topology")
    check(sorted(topology) == [0, 1, 2, 3], f"{where}: topology lines from {sorted(topology)}:\n"
                                            f"{stdout}")
    for rank, t in topology.items():
        expected = {"rank": rank, "size": 4, "local_rank": rank % SLOTS, "local_size": SLOTS,
                    "cross_rank": rank // SLOTS, "cross_size": 2}
        got = {k: t[k] for k in expected}
        check(got == expected, f"{where}: rank {rank} has {got}, expected {expected}")
        check(host_of_rank(t) == f"#{rank // SLOTS}",
              f"{where}: rank {rank} ran on {t['host']} (host id '{t['host_id']}')")
    allreduce = rank_json(stdout, "allreduce")
    check(sorted(allreduce) == [0, 1, 2, 3], f"{where}: allreduce lines from {sorted(allreduce)}")
    for rank, a in allreduce.items():
        check(a["wrong"] == 0, f"{where}: rank {rank}: {a['wrong']} wrong elements")
        check(a["hierarchical_collectives"] >= 1,
              f"{where}: rank {rank} ran no hierarchical allreduce: {a}")


def check_host_library(done, gloo, where):
    """The probe's allreduce: exact on every rank, and over Gloo on every rank or on none."""
    allreduce = rank_json(done.stdout, "allreduce")
    check(sorted(allreduce) == [0, 1, 2, 3], f"{where}: allreduce lines from {sorted(allreduce)}")
    for rank, a in allreduce.items():
        check(a["wrong"] == 0, f"{where}: rank {rank}: {a['wrong']} wrong elements")
        check((a["gloo_collectives"] >= 1) == gloo,
              f"{where}: rank {rank} should have run {'over Gloo' if gloo else 'over MPI'}: {a}")


def check_training(stdout, where):
    losses = [float(x) for x in re.findall(r"^\[0\]<stdout>:epoch +\d+ loss ([0-9.]+)", stdout,
                                           re.MULTILINE)]
    check(len(losses) >= 2, f"{where}: expected an 'epoch N loss X' line per epoch from rank 0:\n"
                            f"{stdout}")
    check(losses[-1] < 0.6 * losses[0], f"{where}: the loss did not fall: {losses}")
    check(re.search(r"^\[1\]<stdout>:", stdout, re.MULTILINE) is None,
          f"{where}: only rank 0 prints")
    return losses


def job_environment():
    """The environment the jobs run in: this script's own DTRAIN_TEST_* inputs stay out, as the
    ranks would rightly warn about variables that are not dtrain settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DTRAIN_TEST_")}
    env["DTRAIN_HIERARCHICAL_ALLREDUCE"] = "1"
    return env


def real_hosts():
    host_name = {"dtrain-host-a": "#0", "dtrain-host-b": "#1"}
    env = job_environment()
    with netns_cluster.Cluster(hosts=2) as cluster:
        a, b = cluster.hosts
        common = [DTRAINRUN, "-H", cluster.host_list(SLOTS), "--launcher-agent", cluster.agent]

        done = run_job(cluster.on(a, common + ["-x", "LAUNCHER_TEST_MARK=forwarded", "--",
                                               ENV_REPORT, "DTRAIN_HIERARCHICAL_ALLREDUCE",
                                               "LAUNCHER_TEST_MARK"]), env, "the variables job",
                       lambda out: out.count('"env"') == 4)
        check_variables(done.stdout, "namespaces")

        before = link_bytes(cluster)
        done = run_job(cluster.on(a, common + ["--", PROBE, "--elements", str(ELEMENTS)]), env,
                       "the probe job", probe_finished)
        after = link_bytes(cluster)
        check_probe(done.stdout, lambda t: host_name.get(t["host"]), "namespaces")
        crossed = [y - x for x, y in zip(before, after)]
        # Each of the two cross-host allreduces carries half of the 16 MiB; at least that much
        # must come in, and go out, over host A's end of the link.
        check(min(crossed) >= ELEMENTS * 4 // 2,
              f"only {crossed} bytes (received, sent) crossed the link for a {ELEMENTS * 4} byte "
              f"allreduce: the ranks talked through shared memory")
        print(f"probe: topology and hierarchical allreduce correct; host A's link: received "
              f"{crossed[0]} bytes, sent {crossed[1]} bytes")

        auto_env = {k: v for k, v in env.items() if k != "DTRAIN_HIERARCHICAL_ALLREDUCE"}
        probe = common + ["--", PROBE, "--elements", "65536"]
        done = run_job(cluster.on(a, probe), auto_env, "the auto probe job", probe_finished)
        check_host_library(done, True, "auto across machines")
        done = run_job(cluster.on(a, probe), dict(auto_env, DTRAIN_GLOO_IFACE="dtrain-none0"),
                       "the auto probe job without a Gloo interface", probe_finished)
        check_host_library(done, False, "auto without a Gloo interface")
        check("but Gloo could not connect, so host tensors go over MPI" in done.stderr,
              f"auto fell back to MPI without the warning:\n{done.stderr}")
        print("host library: auto took Gloo across the machines, and MPI where Gloo could not "
              "connect")

        before = link_bytes(cluster)
        done = run_job(cluster.on(a, common + ["--", PLAIN_TRAIN, "--epochs", str(EPOCHS)]),
                       env, "the training job", training_finished)
        losses = check_training(done.stdout, "namespaces")
        crossed = [y - x for x, y in zip(before, link_bytes(cluster))]
        check(min(crossed) > 0, f"training moved {crossed} bytes over the link")
        print(f"training: loss {losses[0]:.4f} -> {losses[-1]:.4f} over {len(losses)} epochs; "
              f"link: received {crossed[0]} bytes, sent {crossed[1]} bytes")

        port = "29517"
        cluster_env = dict(env, DTRAIN_HOSTS=",".join(h.address for h in cluster.hosts))
        command = [DTRAINRUN, "--cluster", "--slots", str(SLOTS), "--cluster-port", port,
                   "--launcher-agent", cluster.agent, "--cluster-timeout", "60", "--", PROBE,
                   "--elements", "4096"]
        follower = subprocess.Popen(cluster.on(b, command),
                                    env=dict(cluster_env, DTRAIN_CURRENT_HOST=b.address),
                                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
        try:
            leader = run_job(cluster.on(a, command),
                             dict(cluster_env, DTRAIN_CURRENT_HOST=a.address),
                             "the cluster leader", probe_finished)
            out, err = follower.communicate(timeout=JOB_TIMEOUT_S)
        finally:
            if follower.poll() is None:
                follower.kill()
                follower.communicate()
        check(follower.returncode == 0, f"the cluster follower exited with "
                                        f"{follower.returncode}:\n{out}\n{err}")
        check_probe(leader.stdout, lambda t: host_name.get(t["host"]), "cluster leader")
        mine = rank_json(out, "topology")
        check(sorted(mine) == [2, 3] and all(t["host"] == b.name for t in mine.values()),
              f"the follower on {b.name} should print its ranks 2 and 3 only:\n{out}")
        print("cluster mode: leader and follower exited 0; the follower printed ranks 2-3")


def emulated_hosts():
    host_id = {"emulated-host-0": "#0", "emulated-host-1": "#1"}
    env = job_environment()
    env.pop("DTRAIN_HOST_ID", None)
    common = [DTRAINRUN, "-np", str(2 * SLOTS)]

    done = run_job(common + ["-x", "LAUNCHER_TEST_MARK=forwarded", "--", ENV_REPORT,
                             "DTRAIN_HIERARCHICAL_ALLREDUCE", "LAUNCHER_TEST_MARK"], env,
                   "the variables job", lambda out: out.count('"env"') == 4)
    check_variables(done.stdout, "emulation")

    done = run_job(common + ["--", EMULATE, str(SLOTS), PROBE, "--elements", str(ELEMENTS)], env,
                   "the probe job", probe_finished)
    check_probe(done.stdout, lambda t: host_id.get(t["host_id"]), "emulation")

    done = run_job(common + ["--", EMULATE, str(SLOTS), PLAIN_TRAIN, "--epochs", str(EPOCHS)],
                   env, "the training job", training_finished)
    losses = check_training(done.stdout, "emulation")
    print(f"training: loss {losses[0]:.4f} -> {losses[-1]:.4f} over {len(losses)} epochs")

    with socket.socket() as s:
        s.bind(("", 0))
        port = str(s.getsockname()[1])
    hosts = "127.0.0.1,127.0.0.2"
    command = [DTRAINRUN, "--cluster", "--slots", str(SLOTS), "--cluster-port", port,
               "--launcher-agent", LOCAL_AGENT, "--cluster-timeout", "60", "--", EMULATE,
               str(SLOTS), PROBE, "--elements", "4096"]
    follower = subprocess.Popen(command, env=dict(env, DTRAIN_HOSTS=hosts,
                                                  DTRAIN_CURRENT_HOST="127.0.0.2"),
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    try:
        leader = run_job(command, dict(env, DTRAIN_HOSTS=hosts, DTRAIN_CURRENT_HOST="127.0.0.1"),
                         "the cluster leader", probe_finished)
        out, err = follower.communicate(timeout=JOB_TIMEOUT_S)
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.communicate()
    check(follower.returncode == 0, f"the follower exited with {follower.returncode}:\n{err}")
    check_probe(leader.stdout, lambda t: host_id.get(t["host_id"]), "emulated cluster")
    check(sorted(rank_json(out, "topology")) == [2, 3],
          f"the follower should print its ranks 2 and 3 only:\n{out}")
    print("cluster mode: leader and follower exited 0; the follower printed ranks 2-3")


def main():
    reason = namespaces_unavailable()
    if reason and os.environ.get("DTRAIN_TEST_REQUIRE_NETNS") == "1":
        print(f"FAILED: network namespaces are not available ({reason}), but "
              f"DTRAIN_TEST_REQUIRE_NETNS=1 says this machine provides them")
        return 1
    try:
        if reason is None:
            real_hosts()
            print("PASSED: a 2-host x 2-slot job across two network namespaces")
            return 0
        print(f"network namespaces are not available ({reason}); running the same job with "
              f"DTRAIN_HOST_ID emulation instead")
        emulated_hosts()
        print(f"SKIPPED: the job passed with DTRAIN_HOST_ID emulation, but no network was "
              f"crossed ({reason})")
        return SKIPPED
    except (Failure, netns_cluster.ClusterError, subprocess.TimeoutExpired) as e:
        print(f"FAILED: {e}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
