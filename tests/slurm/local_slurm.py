"""A private SLURM cluster for tests: munged, slurmctld and one slurmd per node, with every key,
socket, state file and log in one temporary folder, stopped on exit, on failure and on Ctrl-C.

It installs nothing: it uses Debian's slurmctld, slurmd, slurm-client and munge packages
(tools/install-deps.sh --slurm), needs root, and leaves the machine's own /etc/slurm,
/etc/munge and any running munged alone (its munged has its own key and socket, named in
slurm.conf's AuthInfo, and clients find that slurm.conf through SLURM_CONF).

    with LocalSlurm(nodes=2) as cluster:
        done = cluster.run(["sbatch", "--wait", "-N", "2", script])

One node runs in this machine's network namespace, named like this machine (NodeAddr
127.0.0.1). Two nodes are two "hosts" in the manner of tests/launcher/multihost_netns.py: each
slurmd has its own network, UTS (host name), IPC and mount namespace with its own /etc/hosts,
/dev/shm and boot id, and the namespaces are joined by a veth pair; slurmctld runs in the first
node's network namespace, and so do the client commands (cluster.command()).

`python3 local_slurm.py [--nodes N]` starts a cluster, prints how to use it and keeps it up until
Enter or Ctrl-C: for trying jobs by hand.

Note [Cleaning up SLURM]
slurmd starts every job step in a slurmstepd that leaves its parent (a double fork), and the
step's tasks are its children: stopping slurmd stops none of them. So the cluster lives in a
supervisor process (this file, run with --serve) that is a child subreaper
(PR_SET_CHILD_SUBREAPER): everything the daemons start stays below it in the process tree, it
collects their exit status while the cluster runs, and when it stops it ends every process
below it, deletes the namespaces and the folder. The supervisor stops when its standard input
closes (LocalSlurm.stop(), or the test process ending in any way, SIGKILL included), on SIGINT
(Ctrl-C reaches the whole process group), SIGTERM and SIGHUP, and when its parent dies
(PR_SET_PDEATHSIG). Namespaces left by a supervisor that was itself killed outright carry its
process id in their names and are deleted by the next start.
"""
import argparse
import ctypes
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Dict, List, Optional, Sequence

SKIPPED = 77
DAEMONS = ("munged", "mungekey", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "salloc", "scancel", "scontrol", "squeue", "sinfo")
START_TIMEOUT_S = 60.0
# Between scancel's SIGTERM and its SIGKILL: short, so that a test of scancel does not wait long.
KILL_WAIT_S = 5
_NAMESPACE_PREFIX = "dtslurm"
_SUBNET = "10.201.0"
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


class Unavailable(Exception):
    """SLURM cannot run here: the tests that need it are skipped, with this reason."""


def _run(argv: Sequence[str], timeout: float = 30, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, errors="replace",
                          timeout=timeout, check=False, **kwargs)


def _prctl(option: int, value: int) -> bool:
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _die_with_parent() -> None:
    _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _sbin(name: str) -> Optional[str]:
    """Debian puts the daemons in /usr/sbin, which a non-login PATH may lack."""
    found = shutil.which(name)
    if found is None and os.access(os.path.join("/usr/sbin", name), os.X_OK):
        found = os.path.join("/usr/sbin", name)
    return found


def unavailable(nodes: int = 1) -> Optional[str]:
    """Why a cluster of `nodes` nodes cannot start here, or None."""
    if os.geteuid() != 0:
        return "a private SLURM needs root (slurmd starts the jobs as their users)"
    missing = [p for p in DAEMONS + CLIENTS if _sbin(p) is None]
    if missing:
        return (f"{', '.join(missing)} not installed (tools/install-deps.sh --slurm installs "
                f"slurmctld, slurmd, slurm-client and munge)")
    if nodes > 1:
        for tool in ("ip", "nsenter", "unshare", "mount", "hostname"):
            if shutil.which(tool) is None:
                return f"'{tool}' is not installed (several nodes need network namespaces)"
        name = f"{_NAMESPACE_PREFIX}{os.getpid()}probe"
        made = _run(["ip", "netns", "add", name])
        if made.returncode != 0:
            return f"network namespaces are refused here: {made.stdout.strip()}"
        entered = _run([*_enter_network(name), "unshare", "--uts", "--ipc", "--mount", "true"])
        _run(["ip", "netns", "del", name])
        if entered.returncode != 0:
            return f"entering namespaces is refused here: {entered.stdout.strip()}"
    return None


def _enter_network(namespace: str) -> List[str]:
    """The prefix that runs a command in a network namespace. Not `ip netns exec`, which mounts
    a new /sys without the cgroup file systems that slurmd insists on finding (_as_host())."""
    return ["nsenter", f"--net=/run/netns/{namespace}"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _children_by_parent() -> Dict[int, List[int]]:
    children: Dict[int, List[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # The command name, in parentheses, may itself hold spaces and parentheses.
        fields = stat[stat.rfind(b")") + 2:].split()
        children.setdefault(int(fields[1]), []).append(int(entry))
    return children


def descendants(pid: int) -> List[int]:
    """Every process below `pid`."""
    tree, found, queue = _children_by_parent(), [], [pid]
    while queue:
        for child in tree.get(queue.pop(0), []):
            found.append(child)
            queue.append(child)
    return found


def _kill(pids: Sequence[int], number: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, number)
        except OSError:
            pass


def _reap_all() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _delete_stale_namespaces() -> None:
    """Namespaces of earlier clusters whose supervisor is gone (killed before it could clean)."""
    for line in _run(["ip", "netns", "list"]).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        if not name.startswith(_NAMESPACE_PREFIX):
            continue
        owner = name[len(_NAMESPACE_PREFIX):].split("n")[0].split("p")[0]
        if owner.isdigit() and not os.path.exists(f"/proc/{owner}"):
            pids = _run(["ip", "netns", "pids", name]).stdout.split()
            _kill([int(p) for p in pids if p.isdigit()], signal.SIGKILL)
            _run(["ip", "netns", "del", name])


class _Node:
    def __init__(self, name: str, address: str, namespace: Optional[str]):
        self.name, self.address, self.namespace = name, address, namespace
        self.boot_id: Optional[str] = None
        self.process: Optional[subprocess.Popen] = None


class _Supervisor:
    """The cluster itself, in the supervisor process (Note [Cleaning up SLURM])."""

    def __init__(self, nodes: int, cpus: int):
        self.cpus = cpus
        self.folder = tempfile.mkdtemp(prefix="dtrain-slurm-")
        self.processes: List[subprocess.Popen] = []
        self.namespaces: List[str] = []
        self.control_namespace: Optional[str] = None
        self.hosts_file: Optional[str] = None
        self.conf = os.path.join(self.folder, "slurm.conf")
        if nodes == 1:
            name = socket.gethostname()
            self.nodes = [_Node(name, "127.0.0.1", None)]
            self.controller = (name, "127.0.0.1")
        else:
            tag = f"{_NAMESPACE_PREFIX}{os.getpid()}"
            self.nodes = [_Node(f"dtrain-node{i}", f"{_SUBNET}.{i + 1}", f"{tag}n{i}")
                          for i in range(nodes)]
            self.controller = ("dtrain-slurmctld", self.nodes[0].address)

    def describe(self) -> Dict[str, object]:
        return {"folder": self.folder, "conf": self.conf, "nodes": [n.name for n in self.nodes],
                "control_namespace": self.control_namespace}

    def command(self, argv: Sequence[str]) -> List[str]:
        if self.control_namespace is None:
            return list(argv)
        return [*_enter_network(self.control_namespace), *argv]

    def env(self) -> Dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        env["SLURM_CONF"] = self.conf
        return env

    # ---- starting

    def start(self) -> None:
        # munged refuses a socket folder that others may write to; the jobs' folder is for all.
        os.chmod(self.folder, 0o755)
        for sub in ("munge", "state", "spool", "log", "jobs"):
            os.mkdir(os.path.join(self.folder, sub), 0o755)
        os.chmod(os.path.join(self.folder, "jobs"), 0o1777)
        if len(self.nodes) > 1:
            _delete_stale_namespaces()
            self._make_network()
        self._start_munge()
        self._write_conf()
        self._start_slurmctld()
        for node in self.nodes:
            self._start_slurmd(node)
        self._wait_until_idle()

    def _ip(self, *args: str) -> None:
        done = _run(["ip", *args])
        if done.returncode != 0:
            raise Unavailable(f"ip {' '.join(args)}: {done.stdout.strip()}")

    def _make_network(self) -> None:
        for node in self.nodes:
            self._ip("netns", "add", node.namespace)
            self.namespaces.append(node.namespace)
        a, b = self.nodes
        # Named after this process, like the namespaces: two clusters may be starting at once.
        veths = [f"dts{os.getpid()}v{i}"[-15:] for i in range(2)]
        self._ip("link", "add", veths[0], "netns", a.namespace, "type", "veth", "peer",
                 "name", veths[1], "netns", b.namespace)
        for node, veth in zip(self.nodes, veths):
            self._ip("-n", node.namespace, "addr", "add", f"{node.address}/24", "dev", veth)
            self._ip("-n", node.namespace, "link", "set", veth, "up")
            self._ip("-n", node.namespace, "link", "set", "lo", "up")
            node.boot_id = os.path.join(self.folder, f"boot_id.{node.name}")
            with open(node.boot_id, "w") as f:
                f.write(f"{uuid.uuid4()}\n")
        self.control_namespace = a.namespace
        self.hosts_file = os.path.join(self.folder, "hosts")
        with open(self.hosts_file, "w") as f:
            f.write("127.0.0.1 localhost\n")
            f.write(f"{self.controller[1]} {self.controller[0]}\n")
            for node in self.nodes:
                f.write(f"{node.address} {node.name}\n")
        # Until a veth reports carrier, a job's UCX leaves it out and finds no way to the other
        # node.
        deadline = time.monotonic() + 10
        for node, veth in zip(self.nodes, veths):
            while "state UP" not in _run(["ip", "-n", node.namespace, "-o", "link", "show",
                                          veth]).stdout:
                if time.monotonic() > deadline:
                    raise Unavailable(f"the veth of {node.name} never came up")
                time.sleep(0.05)

    def _as_host(self, name: str, namespace: str, boot_id: Optional[str],
                 argv: Sequence[str]) -> List[str]:
        """`argv` run as host `name`: in its network namespace, with its own host name, IPC,
        /etc/hosts (naming every node), /dev/shm and boot id (Note [Two hosts on one machine]
        in tests/launcher/multihost_netns.py says why each is needed), and a /sys of its own
        network, where UCX finds the node's network interfaces; the cgroup file systems that
        slurmd insists on finding are moved over to that /sys."""
        cgroup = os.path.join(self.folder, f"cgroup.{name}")
        os.mkdir(cgroup)
        setup = ('hostname "$1" && mount --bind "$2" /etc/hosts && '
                 'mount -t tmpfs dtrain-shm /dev/shm && '
                 '{ [ "$3" = - ] || mount --bind "$3" /proc/sys/kernel/random/boot_id; } && '
                 'mount --rbind /sys/fs/cgroup "$4" && mount -t sysfs sysfs /sys && '
                 'mount --move "$4" /sys/fs/cgroup && shift 4 && exec "$@"')
        return [*_enter_network(namespace), "unshare", "--uts", "--ipc", "--mount", "sh", "-c",
                setup, "as-host", name, self.hosts_file, boot_id or "-", cgroup, *argv]

    def _spawn(self, name: str, argv: Sequence[str]) -> subprocess.Popen:
        with open(os.path.join(self.folder, "log", f"{name}.out"), "wb") as log:
            process = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=log,
                                       stderr=subprocess.STDOUT, env=self.env(),
                                       preexec_fn=_die_with_parent)
        self.processes.append(process)
        return process

    def _start_munge(self) -> None:
        munge = os.path.join(self.folder, "munge")
        self.munge_socket = os.path.join(munge, "munge.socket")
        key = os.path.join(munge, "munge.key")
        made = _run([_sbin("mungekey"), "--create", f"--keyfile={key}"])
        if made.returncode != 0:
            raise Unavailable(f"mungekey cannot create a key: {made.stdout.strip()}")
        os.chmod(key, 0o400)
        process = self._spawn("munged", [
            _sbin("munged"), "--foreground", "--force", f"--socket={self.munge_socket}",
            f"--key-file={key}", f"--pid-file={munge}/munged.pid",
            f"--seed-file={munge}/munged.seed", f"--log-file={self.folder}/log/munged.log"])
        self._wait_for(lambda: os.path.exists(self.munge_socket), process, "munged",
                       "made its socket")

    def _write_conf(self) -> None:
        control_name, control_address = self.controller
        f = self.folder
        lines = [
            "ClusterName=dtraintest",
            f"SlurmctldHost={control_name}({control_address})",
            f"SlurmctldPort={_free_port()}",
            f"SlurmdPort={_free_port()}",
            # Root runs everything: the tests run as root, and no slurm user need exist.
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={f}/state",
            f"SlurmdSpoolDir={f}/spool/%n",
            f"SlurmctldPidFile={f}/slurmctld.pid",
            f"SlurmdPidFile={f}/slurmd.%n.pid",
            f"SlurmctldLogFile={f}/log/slurmctld.log",
            f"SlurmdLogFile={f}/log/slurmd.%n.log",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            # Processes are found by their parent chain, not by cgroups, which a container may
            # not let slurmd manage; proctrack/pgid would lose dtrainrun's MPI launcher, which
            # runs in a process group of its own.
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "SwitchType=switch/none",
            "MpiDefault=none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "SchedulerType=sched/builtin",
            "ReturnToService=2",
            # The nodes are what this file says, whatever the machine has: two nodes of 2 CPUs
            # on a 2-core machine.
            "SlurmdParameters=config_overrides",
            f"KillWait={KILL_WAIT_S}",
            "InactiveLimit=0",
            "MinJobAge=300",
            "SlurmdTimeout=60",
            "MessageTimeout=20",
            "MailProg=/bin/true",
            f"PlugStackConfig={f}/plugstack.conf",
        ]
        for node in self.nodes:
            lines.append(f"NodeName={node.name} NodeHostname={node.name} NodeAddr={node.address}"
                         f" CPUs={self.cpus} State=UNKNOWN")
        lines.append("PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
        with open(self.conf, "w") as out:
            out.write("\n".join(lines) + "\n")
        with open(os.path.join(f, "plugstack.conf"), "w"):
            pass

    def _start_slurmctld(self) -> None:
        argv = [_sbin("slurmctld"), "-D", "-c", "-i", "-f", self.conf]
        if self.control_namespace is not None:
            argv = self._as_host(self.controller[0], self.control_namespace, None, argv)
        process = self._spawn("slurmctld", argv)
        self._wait_for(self._answers_ping, process, "slurmctld", "answered `scontrol ping`")

    def _answers_ping(self) -> bool:
        done = _run(self.command(["scontrol", "ping"]), env=self.env())
        return done.returncode == 0 and "UP" in done.stdout

    def _start_slurmd(self, node: _Node) -> None:
        os.mkdir(os.path.join(self.folder, "spool", node.name), 0o755)
        argv = [_sbin("slurmd"), "-D", "-f", self.conf, "-N", node.name]
        if node.namespace is not None:
            argv = self._as_host(node.name, node.namespace, node.boot_id, argv)
        node.process = self._spawn(f"slurmd.{node.name}", argv)

    def _wait_until_idle(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        states: Dict[str, str] = {}
        while time.monotonic() < deadline:
            for node in self.nodes:
                if node.process.poll() is not None:
                    raise Unavailable(f"slurmd of {node.name} exited with "
                                      f"{node.process.returncode}:\n"
                                      + self.log_tail(f"slurmd.{node.name}"))
            done = _run(self.command(["sinfo", "--noheader", "--Node", "--format=%N %T"]),
                        env=self.env())
            states = dict(line.split()[:2] for line in done.stdout.splitlines()
                          if len(line.split()) >= 2)
            if all(states.get(n.name) == "idle" for n in self.nodes):
                return
            time.sleep(0.2)
        raise Unavailable(f"the nodes are not idle after {START_TIMEOUT_S:g} s: {states}\n"
                          + "\n".join(self.log_tail(f"slurmd.{n.name}") for n in self.nodes))

    def _wait_for(self, ready, process: subprocess.Popen, name: str, what: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not ready():
            if process.poll() is not None:
                raise Unavailable(f"{name} exited with {process.returncode} before it {what}:\n"
                                  f"{self.log_tail(name)}")
            if time.monotonic() > deadline:
                raise Unavailable(f"{name} has not {what} after {START_TIMEOUT_S:g} s:\n"
                                  f"{self.log_tail(name)}")
            time.sleep(0.1)

    def log_tail(self, name: str, lines: int = 20) -> str:
        text: List[str] = []
        for path in (os.path.join(self.folder, "log", f"{name}.out"),
                     os.path.join(self.folder, "log", f"{name}.log")):
            try:
                with open(path, errors="replace") as f:
                    text += f.read().splitlines()[-lines:]
            except OSError:
                pass
        return "\n".join(text)

    # ---- stopping

    def stop(self) -> None:
        """Ends the daemons, then every process left below this one (slurmstepd and the jobs:
        Note [Cleaning up SLURM]), the namespaces and the folder."""
        for process in reversed(self.processes):
            _kill([process.pid], signal.SIGTERM)
        # Nothing of the cluster is kept, so slurmctld need not finish saving its state (which
        # takes it seconds after a job).
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline and any(
                p.poll() is None for p in self.processes):
            time.sleep(0.05)
        for _ in range(5):
            left = descendants(os.getpid())
            if not left:
                break
            _kill(left, signal.SIGKILL)
            time.sleep(0.1)
            _reap_all()
        for namespace in self.namespaces:
            pids = _run(["ip", "netns", "pids", namespace]).stdout.split()
            _kill([int(p) for p in pids if p.isdigit()], signal.SIGKILL)
            _run(["ip", "netns", "del", namespace])
        shutil.rmtree(self.folder, ignore_errors=True)


class _Stop(Exception):
    pass


def _raise_stop(_number, _frame) -> None:
    raise _Stop()


def serve(nodes: int, cpus: int) -> int:
    """The supervisor: starts the cluster, writes one JSON line (what the cluster is, or why it
    could not start), keeps it up until its standard input closes or a signal comes, stops it."""
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    _die_with_parent()
    for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(number, _raise_stop)
    cluster = None
    try:
        try:
            cluster = _Supervisor(nodes, cpus)
            cluster.start()
        except (Unavailable, OSError, subprocess.SubprocessError) as e:
            sys.stdout.write(json.dumps({"error": str(e)}) + "\n")
            sys.stdout.flush()
            return 1
        sys.stdout.write(json.dumps(cluster.describe()) + "\n")
        sys.stdout.flush()
        while True:
            # Collecting exit statuses here is safe: nothing else in this process waits for a
            # child until stop().
            _reap_all()
            ready, _, _ = select.select([sys.stdin], [], [], 0.5)
            if ready and not os.read(sys.stdin.fileno(), 1024):
                return 0
    except _Stop:
        return 0
    finally:
        for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(number, signal.SIG_IGN)
        if cluster is not None:
            cluster.stop()


class LocalSlurm:
    """A private cluster of `nodes` nodes (1, or 2 in network namespaces) of `cpus` CPUs each,
    run by a supervisor process. __enter__ raises Unavailable when SLURM cannot run here."""

    def __init__(self, nodes: int = 1, cpus: int = 2):
        if nodes not in (1, 2):
            raise ValueError("a local cluster has 1 node, or 2 in network namespaces")
        self.nodes_count, self.cpus = nodes, cpus
        self.supervisor: Optional[subprocess.Popen] = None
        self.clients: List[subprocess.Popen] = []

    def __enter__(self) -> "LocalSlurm":
        reason = unavailable(self.nodes_count)
        if reason is not None:
            raise Unavailable(reason)
        self.supervisor = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--serve", "--nodes",
             str(self.nodes_count), "--cpus", str(self.cpus)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            ready, _, _ = select.select([self.supervisor.stdout], [], [], START_TIMEOUT_S + 30)
            line = self.supervisor.stdout.readline() if ready else ""
            info = json.loads(line) if line.strip() else {"error": "the supervisor said nothing"}
        except BaseException:
            self.stop()
            raise
        if "error" in info:
            self.stop()
            raise Unavailable(f"SLURM did not start: {info['error']}")
        self.folder: str = info["folder"]
        self.conf: str = info["conf"]
        self.node_names: List[str] = info["nodes"]
        self.control_namespace: Optional[str] = info["control_namespace"]
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        """Stops the cluster and waits until it is gone; safe to call again."""
        for client in self.clients:
            if client.poll() is None:
                client.kill()
            client.communicate()
        self.clients = []
        if self.supervisor is None:
            return
        supervisor, self.supervisor = self.supervisor, None
        supervisor.stdin.close()
        try:
            supervisor.wait(timeout=60)
        except subprocess.TimeoutExpired:
            supervisor.kill()
            supervisor.wait()
        supervisor.stdout.close()

    # ---- using it

    def env(self, **extra: str) -> Dict[str, str]:
        """The environment for client commands and the jobs they submit (sbatch passes it on):
        this one without SLURM_*, MPI launcher or dtrain variables from outside, with
        SLURM_CONF."""
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("SLURM_", "SBATCH_", "SALLOC_", "SRUN_", "DTRAIN_",
                                    "HOROVOD_", "DTRAINRUN_", "PMI_", "PMIX_", "HYDRA_"))}
        env["SLURM_CONF"] = self.conf
        env.update(extra)
        return env

    def command(self, argv: Sequence[str]) -> List[str]:
        """`argv` as a client of this cluster (with two nodes: on the first node's network)."""
        if self.control_namespace is None:
            return list(argv)
        return [*_enter_network(self.control_namespace), *argv]

    @property
    def jobs_folder(self) -> str:
        """Where batch scripts and their output go: the jobs' working folder."""
        return os.path.join(self.folder, "jobs")

    def run(self, argv: Sequence[str], timeout: float = 120,
            env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
        """A client command, to its end; stdout and stderr apart, as text."""
        return subprocess.run(self.command(argv), env=env or self.env(),
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, errors="replace",
                              timeout=timeout, check=False, cwd=self.jobs_folder)

    def popen(self, argv: Sequence[str], env: Optional[Dict[str, str]] = None
              ) -> subprocess.Popen:
        """A client command left running; stop() kills it if it is still running."""
        process = subprocess.Popen(self.command(argv), env=env or self.env(),
                                   stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, errors="replace",
                                   cwd=self.jobs_folder)
        self.clients.append(process)
        return process

    def script(self, name: str, body: str) -> str:
        """A batch script in the jobs' folder: `body` after a #!/bin/sh line."""
        path = os.path.join(self.jobs_folder, name)
        with open(path, "w") as f:
            f.write("#!/bin/sh\n" + body)
        os.chmod(path, 0o755)
        return path

    def read(self, name: str) -> str:
        """A file of the jobs' folder (a job's output), or '' if it does not exist."""
        try:
            with open(os.path.join(self.jobs_folder, name), errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def job(self, job_id: str) -> Dict[str, str]:
        """`scontrol show job`'s fields (JobState, ExitCode, ...)."""
        done = self.run(["scontrol", "--oneliner", "show", "job", job_id], timeout=30)
        fields: Dict[str, str] = {}
        for word in done.stdout.split():
            key, sep, value = word.partition("=")
            if sep:
                fields.setdefault(key, value)
        return fields

    def wait_for_job(self, job_id: str, states: Sequence[str], timeout: float = 60) -> str:
        """Waits until the job is in one of `states`; returns the state."""
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            state = self.job(job_id).get("JobState", "")
            if state in states:
                return state
            time.sleep(0.2)
        raise AssertionError(f"job {job_id} is {state or 'unknown'} after {timeout:g} s, not "
                             f"{' or '.join(states)}")

    def log_tail(self, name: str, lines: int = 30) -> str:
        """The end of a daemon's log: slurmctld, or slurmd.NODE."""
        path = os.path.join(self.folder, "log", f"{name}.log")
        try:
            with open(path, errors="replace") as f:
                return "\n".join(f.read().splitlines()[-lines:])
        except OSError:
            return ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1, choices=(1, 2))
    parser.add_argument("--cpus", type=int, default=2)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        return serve(args.nodes, args.cpus)
    try:
        with LocalSlurm(args.nodes, args.cpus) as cluster:
            prefix = " ".join(cluster.command([]))
            print(f"SLURM is up: nodes {', '.join(cluster.node_names)}\n"
                  f"  export SLURM_CONF={cluster.conf}\n"
                  + (f"  run clients as: {prefix} sbatch ...\n" if prefix else "")
                  + "Enter or Ctrl-C stops it.")
            try:
                sys.stdin.readline()
            except KeyboardInterrupt:
                pass
    except Unavailable as e:
        print(f"SLURM cannot run here: {e}")
        return SKIPPED
    return 0


if __name__ == "__main__":
    sys.exit(main())
