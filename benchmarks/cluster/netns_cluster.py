"""Hosts on one machine that MPI treats as separate machines, joined by rate-limited links.

Each host is its own network, UTS (host name), IPC and mount namespace with a private /dev/shm
and boot id (Note [Two hosts on one machine]); its one interface, eth0, is a veth pair whose
other end is a port of a Linux bridge that lives in a namespace of its own, the switch. Processes
enter a host through `enter.sh HOST COMMAND...`; MPICH's Hydra reaches the other hosts through
`agent.sh HOST COMMAND` (dtrainrun --launcher-agent), as it would through ssh.

Links are shaped with `tc`: `tbf` or `htb` on both ends of every host's veth, so each host sends
and receives at the set rate, like a NIC on a switch. `netem` is not available on the kernels
this was written for ("Specified qdisc kind is unknown"), so links add no latency: a shaped link
here has the bandwidth of the link it stands for, not its latency.

A host may also have a local disk (Cluster(local_dir=...)): a folder of the cluster's temporary
folder that the host sees at `local_dir` and no other host sees there. Unlike /dev/shm, which each
entry into a host makes afresh, it keeps its files from one entry to the next, as a disk keeps
them across jobs.

Everything lives inside namespaces named `<prefix><pid>.<start time>-<role>`: deleting them
removes every veth, the bridge and every qdisc with them. Cluster tears down on normal exit, on an
exception and on KeyboardInterrupt (install_signal_handlers() turns SIGTERM and SIGHUP into one);
a run killed with SIGKILL leaves its namespaces behind, and the next Cluster with the same prefix
sweeps them (and their processes and temporary folder) before it starts, while those of live
runs are left alone.

Note [Two hosts on one machine]
Measured with MPICH 4.0.2 (ch4:ucx, UCX 1.13) on Debian 12: with separate network and UTS
namespaces only, a 16 MiB allreduce between the "hosts" moved 10 KB over the veth (UCX chose
shared memory: it compares boot ids); with a separate IPC namespace or boot id alone the data
crossed but the job hung at exit; with all of them (and a private /dev/shm) 16.8 MB crossed
each way and the job ended cleanly.
"""
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
LINK_PROBE = os.path.join(HERE, "link_probe.py")
SKIPPED = 77  # ctest's SKIP_RETURN_CODE in this project
QDISCS = ("tbf", "htb")
SUBNET = "10.200.0"
SWITCH_PREFIX_LEN = 24


class ClusterError(Exception):
    pass


def run(argv, timeout=30, check=True, **kwargs):
    done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, timeout=timeout, check=False, text=True,
                          errors="replace", **kwargs)
    if check and done.returncode != 0:
        raise ClusterError(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr.strip()}")
    return done


def _start_time(pid):
    """The process's start time in clock ticks since boot, or None if there is no such process:
    with the pid it names one process, even after the pid is reused."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name in parentheses may hold spaces; the fields after it are fixed.
    return int(stat[stat.rindex(")") + 2:].split()[19])


def namespaces_unavailable():
    """None where namespaced hosts can be made here, else why not."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "unshare", "mount", "hostname"):
        if shutil.which(tool) is None:
            return f"'{tool}' is not installed"
    probe = f"dtrainprobe{os.getpid()}"
    made = run(["ip", "netns", "add", probe], check=False)
    if made.returncode != 0:
        return f"`ip netns add` is refused: {made.stderr.strip()}"
    try:
        entered = run(["ip", "netns", "exec", probe, "unshare", "--uts", "--ipc", "--mount",
                       "true"], check=False)
        if entered.returncode != 0:
            return f"entering namespaces is refused: {entered.stderr.strip()}"
    finally:
        run(["ip", "netns", "del", probe], check=False)
    return None


def shaping_unavailable(qdisc="tbf"):
    """None where `qdisc` can shape a veth inside a namespace, else why not."""
    if shutil.which("tc") is None:
        return "'tc' is not installed"
    probe = f"dtrainshape{os.getpid()}"
    made = run(["ip", "netns", "add", probe], check=False)
    if made.returncode != 0:
        return f"`ip netns add` is refused: {made.stderr.strip()}"
    try:
        link = run(["ip", "-n", probe, "link", "add", "name", "a", "type", "veth", "peer", "name",
                    "b"], check=False)
        if link.returncode != 0:
            return f"veth pairs are refused: {link.stderr.strip()}"
        for command in _shaping_commands("a", 100e6, qdisc):
            done = run(["ip", "netns", "exec", probe, *command], check=False)
            if done.returncode != 0:
                return f"`{' '.join(command)}` is refused: {done.stderr.strip()}"
    finally:
        run(["ip", "netns", "del", probe], check=False)
    return None


def _burst_bytes(rate_bps):
    # tbf and htb refill tokens on timer ticks: a bucket smaller than a tick's worth of bytes
    # caps the rate below the one set. 2 ms of traffic covers that with room, and 64 KiB lets
    # a whole GSO packet through at once at low rates.
    return max(64 << 10, int(rate_bps / 8 * 0.002))


def _shaping_commands(dev, rate_bps, qdisc):
    rate = f"{int(rate_bps)}bit"
    burst = str(_burst_bytes(rate_bps))
    if qdisc == "tbf":
        # 50 ms of queue: TCP fills it instead of losing packets at every burst.
        return [["tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate, "burst",
                 burst, "latency", "50ms"]]
    if qdisc == "htb":
        return [["tc", "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default",
                 "1"],
                ["tc", "class", "add", "dev", dev, "parent", "1:", "classid", "1:1", "htb",
                 "rate", rate, "ceil", rate, "burst", burst, "cburst", burst, "quantum",
                 "60000"]]
    raise ValueError(f"qdisc must be one of {QDISCS}, not {qdisc!r}")


def format_rate(bps):
    for unit, scale in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bps >= scale:
            return f"{bps / scale:.3g} {unit}"
    return f"{bps:.3g} bit/s"


def parse_rate(text):
    """'400mbit', '2.5gbit', '25G', '1e9' -> bits per second."""
    m = re.fullmatch(r"\s*([0-9.]+(?:e[0-9]+)?)\s*([kmg]?)(?:bit|bps|bit/s)?\s*", text.lower())
    if not m:
        raise ValueError(f"not a rate: {text!r} (e.g. 400mbit, 2.5gbit)")
    return float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]


class Host:
    def __init__(self, index, namespace, cpus):
        self.index = index
        self.namespace = namespace
        self.name = f"dtrain-host-{chr(ord('a') + index)}"
        self.address = f"{SUBNET}.{index + 1}"
        self.ifname = "eth0"
        self.port = f"port{index}"  # its end on the switch
        self.cpus = cpus            # e.g. "0" or "2-3"; None: any
        self.boot_id = None
        self.local_disk = None      # what it sees at Cluster.local_dir, on this machine


def _ns_pids(namespace):
    done = run(["ip", "netns", "pids", namespace], check=False)
    return [int(p) for p in done.stdout.split()] if done.returncode == 0 else []


def _kill_namespace_processes(namespaces, grace_s=2.0):
    """Ends every process inside `namespaces` (all started by the cluster that made them):
    a namespace with a process in it outlives `ip netns del`, and so would its links."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = [p for ns in namespaces for p in _ns_pids(ns)]
        if not pids:
            return
        for p in pids:
            try:
                os.kill(p, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(_ns_pids(ns) for ns in namespaces):
            time.sleep(0.05)


def _delete_namespaces(namespaces):
    _kill_namespace_processes(namespaces)
    for ns in namespaces:
        run(["ip", "netns", "del", ns], check=False)


def sweep_stale(prefix):
    """Removes what clusters of `prefix` left behind when they were killed: namespaces and
    temporary folders whose owner (pid and start time in their name) is gone."""
    pattern = re.compile(rf"^{re.escape(prefix)}(\d+)\.(\d+)-")

    def stale(name):
        m = pattern.match(name)
        return m is not None and _start_time(int(m.group(1))) != int(m.group(2))

    done = run(["ip", "netns", "list"], check=False)
    names = [line.split()[0] for line in done.stdout.splitlines() if line.strip()]
    dead = [n for n in names if stale(n)]
    # Hosts before the switch: a host's processes may hold links into it.
    dead.sort(key=lambda n: n.endswith("-switch"))
    _delete_namespaces(dead)
    folders = [f for f in glob.glob(os.path.join(tempfile.gettempdir(), f"{prefix}*"))
               if stale(os.path.basename(f)) and os.path.isdir(f)]
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)
    return dead, folders


def owner_tag(prefix):
    """`<prefix><pid>.<start time>-`: names of this process's objects, which sweep_stale()
    removes once the process is gone. A temporary folder named with it is swept too."""
    me = os.getpid()
    return f"{prefix}{me}.{_start_time(me)}-"


def install_signal_handlers():
    """SIGTERM and SIGHUP unwind like Ctrl-C, so `with Cluster(...)` tears down. SIGINT too,
    even where the shell that started this process ignores it (a background job)."""
    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, interrupt)


class Cluster:
    """`hosts` namespaced hosts on one bridge. Use as a context manager.

    cpus: one CPU list per host (taskset syntax, e.g. ["0", "1"]) so that hosts do not share
    cores, or None to let every host use every core.
    local_dir: an existing folder of this machine (e.g. "/mnt") under which each host sees a
    local disk of its own (Host.local_disk), or None.
    """

    def __init__(self, hosts=2, prefix="dtrain-cluster-", cpus=None, local_dir=None):
        if not 1 <= hosts <= 26:
            raise ValueError("hosts must be within 1..26 (host names dtrain-host-a to -z)")
        if cpus is not None and len(cpus) != hosts:
            raise ValueError("cpus needs one CPU list per host")
        if local_dir is not None and not (os.path.isabs(local_dir) and os.path.isdir(local_dir)):
            raise ValueError(f"local_dir must be an existing folder, given as an absolute path: "
                             f"{local_dir!r}")
        self.prefix = prefix
        self.tag = owner_tag(prefix)
        self.hosts = [Host(i, f"{self.tag}h{i}", None if cpus is None else cpus[i])
                      for i in range(hosts)]
        self.switch = f"{self.tag}switch"
        self.local_dir = local_dir
        self.folder = None
        self.rate_bps = None
        self.qdisc = None
        self._closed = False

    # -- lifetime --------------------------------------------------------------------------

    def __enter__(self):
        sweep_stale(self.prefix)
        try:
            self._set_up()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        """Removes everything this cluster made. Safe to call twice; a second Ctrl-C or SIGTERM
        during it is held back, so it is not left half done."""
        if self._closed:
            return
        held = {}
        if _main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                held[sig] = signal.signal(sig, signal.SIG_IGN)
        try:
            _delete_namespaces([h.namespace for h in self.hosts])
            _delete_namespaces([self.switch])
            if self.folder:
                shutil.rmtree(self.folder, ignore_errors=True)
            self._closed = True
        finally:
            for sig, handler in held.items():
                signal.signal(sig, handler)

    def leftovers(self):
        """Namespaces of this cluster that still exist (none after close())."""
        done = run(["ip", "netns", "list"], check=False)
        return [line.split()[0] for line in done.stdout.splitlines()
                if line.startswith(self.tag)]

    def _ip(self, *args):
        run(["ip", *args])

    def _set_up(self):
        self.folder = tempfile.mkdtemp(prefix=self.tag)
        self._ip("netns", "add", self.switch)
        self._ip("-n", self.switch, "link", "add", "br0", "type", "bridge", "forward_delay", "0")
        self._ip("-n", self.switch, "link", "set", "br0", "up")
        for h in self.hosts:
            self._ip("netns", "add", h.namespace)
            # Made in place, both ends at once: nothing ever appears in this machine's own
            # network namespace, and the names cannot clash with its interfaces.
            self._ip("link", "add", h.ifname, "netns", h.namespace, "type", "veth", "peer",
                     "name", h.port, "netns", self.switch)
            self._ip("-n", self.switch, "link", "set", h.port, "master", "br0")
            self._ip("-n", self.switch, "link", "set", h.port, "up")
            self._ip("-n", h.namespace, "addr", "add", f"{h.address}/{SWITCH_PREFIX_LEN}", "dev",
                     h.ifname)
            self._ip("-n", h.namespace, "link", "set", h.ifname, "up")
            self._ip("-n", h.namespace, "link", "set", "lo", "up")
            h.boot_id = os.path.join(self.folder, f"boot_id.{h.name}")
            with open(h.boot_id, "w") as f:
                f.write(f"{uuid.uuid4()}\n")
            if self.local_dir:
                h.local_disk = os.path.join(self.folder, f"disk.{h.name}")
                os.mkdir(h.local_disk)
        self._wait_for_carrier()
        self._write_scripts()

    def _wait_for_carrier(self, timeout_s=10.0):
        """A veth reports carrier a moment after both ends are up, and UCX leaves out every
        interface that is not running when a rank starts: a job started at once finds no way
        to the other host ("Destination is unreachable" in MPI_Init)."""
        deadline = time.monotonic() + timeout_s
        for h in self.hosts:
            for ns, dev in ((h.namespace, h.ifname), (self.switch, h.port)):
                while True:
                    state = self._read(ns, f"/sys/class/net/{dev}/operstate")
                    if state == "up":
                        break
                    if time.monotonic() > deadline:
                        raise ClusterError(f"{dev} in {ns} is still '{state}' after "
                                           f"{timeout_s} s")
                    time.sleep(0.05)

    def _read(self, namespace, path):
        # /sys/class/net shows the interfaces of the reader's network namespace.
        return run(["ip", "netns", "exec", namespace, "cat", path]).stdout.strip()

    def _write_scripts(self):
        # enter.sh HOST COMMAND...: runs COMMAND inside HOST's namespaces (HOST: name or address).
        self.enter = os.path.join(self.folder, "enter.sh")
        cases = "\n".join(
            f"  {h.address}|{h.name}) ns={h.namespace} name={h.name} boot_id={h.boot_id} "
            f"cpus={h.cpus or ''} disk={h.local_disk or ''} ;;" for h in self.hosts)
        disk = f'mount --bind "$3" {self.local_dir} && ' if self.local_dir else ""
        with open(self.enter, "w") as f:
            f.write(f"""#!/bin/sh
host=$1
shift
case $host in
{cases}
  *) echo "enter.sh: no host $host" >&2; exit 255 ;;
esac
pin=
[ -n "$cpus" ] && pin="taskset -c $cpus"
exec ip netns exec "$ns" $pin unshare --uts --ipc --mount sh -c '
  hostname "$1" && mount --bind "$2" /proc/sys/kernel/random/boot_id &&
  mount -t tmpfs dtrain-shm /dev/shm && {disk}shift 3 && exec "$@"' \\
  enter.sh "$name" "$boot_id" "$disk" "$@"
""")
        # agent.sh HOST COMMAND...: what Hydra calls instead of ssh. COMMAND is a shell command
        # line, and the environment is as bare as an ssh login's.
        self.agent = os.path.join(self.folder, "agent.sh")
        home = os.environ.get("HOME", "/")
        with open(self.agent, "w") as f:
            f.write(f"""#!/bin/sh
host=$1
shift
exec env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME={home} \\
  {self.enter} "$host" sh -c "$*"
""")
        os.chmod(self.enter, 0o755)
        os.chmod(self.agent, 0o755)

    # -- using it --------------------------------------------------------------------------

    def on(self, host, argv):
        """argv run inside `host` (Host, index, name or address)."""
        return [self.enter, self.host(host).address, *argv]

    def host(self, host):
        """The Host named by a Host, an index, a host name or an address."""
        if isinstance(host, Host):
            return host
        if isinstance(host, int):
            return self.hosts[host]
        for h in self.hosts:
            if host in (h.name, h.address):
                return h
        raise KeyError(host)

    def host_list(self, slots=1, hosts=None):
        """dtrainrun's -H value for `hosts` (default all) with `slots` ranks each."""
        chosen = self.hosts if hosts is None else [self.host(h) for h in hosts]
        return ",".join(f"{h.address}:{slots}" for h in chosen)

    def kill_processes(self, hosts=None):
        """Ends every process inside `hosts` (default all): what a job that hangs leaves."""
        chosen = self.hosts if hosts is None else [self.host(h) for h in hosts]
        _kill_namespace_processes([h.namespace for h in chosen])

    def link_bytes(self, host=0):
        """(received, sent) bytes on `host`'s eth0 so far."""
        h = self.host(host)
        return tuple(int(self._read(h.namespace, f"/sys/class/net/{h.ifname}/statistics/{d}"))
                     for d in ("rx_bytes", "tx_bytes"))

    def shape(self, rate_bps, qdisc="tbf"):
        """Limits every host's link to `rate_bps` in each direction; None removes the limit."""
        for h in self.hosts:
            for ns, dev in ((h.namespace, h.ifname), (self.switch, h.port)):
                # A root qdisc of one kind cannot be changed into another: start afresh.
                run(["ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", dev, "root"],
                    check=False)
                if rate_bps is None:
                    continue
                for command in _shaping_commands(dev, rate_bps, qdisc):
                    run(["ip", "netns", "exec", ns, *command])
        self.rate_bps, self.qdisc = rate_bps, (qdisc if rate_bps else None)

    def qdisc_lines(self, host=0):
        h = self.host(host)
        out = []
        for ns, dev in ((h.namespace, h.ifname), (self.switch, h.port)):
            done = run(["ip", "netns", "exec", ns, "tc", "qdisc", "show", "dev", dev])
            out.append(f"{dev}: {done.stdout.strip()}")
        return out

    def measure_throughput(self, sender=0, receiver=1, seconds=1.0, port=5201):
        """Bits per second of one TCP stream from `sender` to `receiver` over `seconds`, as the
        receiver counts them: what a shaped link really carries."""
        src, dst = self.host(sender), self.host(receiver)
        server = subprocess.Popen(
            ["ip", "netns", "exec", dst.namespace, sys.executable, LINK_PROBE, "serve",
             "--bind", dst.address, "--port", str(port), "--timeout", str(seconds + 30)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            ready = server.stdout.readline()
            if ready.strip() != "ready":
                raise ClusterError(f"the link probe did not start on {dst.name}: {ready}"
                                   f"{server.stderr.read()}")
            run(["ip", "netns", "exec", src.namespace, sys.executable, LINK_PROBE, "send",
                 "--to", dst.address, "--port", str(port), "--seconds", str(seconds)],
                timeout=seconds + 30)
            out, err = server.communicate(timeout=30)
            if server.returncode != 0:
                raise ClusterError(f"the link probe on {dst.name} failed: {err.strip()}")
            return json.loads(out)["bits_per_second"]
        finally:
            if server.poll() is None:
                server.kill()
                server.communicate()


def _main_thread():
    import threading
    return threading.current_thread() is threading.main_thread()
