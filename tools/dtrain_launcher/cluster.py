"""Managed clusters: every host runs `dtrainrun --cluster -- program` and one of them, the leader,
starts the job on all of them.

Note [Cluster status channel]
The leader is the first host in sorted order; all hosts compute the same. The others
(followers) connect to a small TCP service on the leader (--cluster-port) and say who they are.
The leader waits until every follower has connected (or --cluster-timeout passes: then the job
fails naming the hosts that never came), so that no host's entry command has exited early, and
then starts the MPI launcher over all hosts. Over the connection it sends each follower the
output lines of the ranks running on that follower's host, dtrainrun's notes (restarts), a
heartbeat every few seconds, and finally the job's exit status; the follower prints the lines to
its own stdout, where the cluster's log collector picks them up, and exits with that status.
A follower that cannot reach the leader within --cluster-timeout, or that hears nothing for
LEADER_SILENCE_S, or whose connection closes before the status arrives, exits with a message
saying so. Messages are JSON, one per line; output lines travel as text with undecodable bytes
escaped (surrogateescape), so they arrive byte for byte.
"""
from __future__ import annotations

import json
import os
import socket
import threading
import time
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Tuple

from .errors import EXIT_LEADER_LOST, EXIT_NOT_STARTED, LaunchError, UsageError, shown
from .hosts import Host, is_host_name, natural_key, parse_host_entry
from .limits import MAX_RANKS, MAX_RANKS_WHY, parse_count
from .job import Output, write_all

PROTOCOL = 1
HEARTBEAT_S = 5.0
LEADER_SILENCE_S = 30.0
_CONNECT_RETRY_S = 1.0


@dataclass
class ClusterHosts:
    hosts: List[Host]  # in sorted order; hosts[0] is the leader
    current: str
    source: str        # which variables they came from, for messages

    @property
    def leader(self) -> str:
        return self.hosts[0].name

    @property
    def followers(self) -> List[str]:
        return [h.name for h in self.hosts[1:]]


def default_slots(env: Mapping[str, str], slots: Optional[int]) -> Tuple[int, str]:
    if slots is not None:
        return slots, "--slots"
    gpus_text = env.get("SM_NUM_GPUS", "").strip()
    if gpus_text:
        gpus = parse_count(gpus_text, MAX_RANKS)
        if gpus is None:
            raise UsageError(f"dtrain: SM_NUM_GPUS={shown(gpus_text)} is not a whole number")
        if gpus > MAX_RANKS:
            raise UsageError(f"dtrain: SM_NUM_GPUS={shown(gpus_text)}: a host has at most "
                             f"{MAX_RANKS} ranks ({MAX_RANKS_WHY})")
        if gpus > 0:
            return gpus, "SM_NUM_GPUS"
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    return cores, "the cores of this host"


def hosts_from_env(env: Mapping[str, str], slots: Optional[int]) -> ClusterHosts:
    count, _ = default_slots(env, slots)
    if env.get("DTRAIN_HOSTS"):
        source = "DTRAIN_HOSTS"
        if not env.get("DTRAIN_CURRENT_HOST"):
            raise UsageError("dtrain: DTRAIN_HOSTS is set but DTRAIN_CURRENT_HOST is not; set it "
                             "to this host's name as it appears in DTRAIN_HOSTS")
        entries = env["DTRAIN_HOSTS"].split(",")
        hosts = [parse_host_entry(e, f"DTRAIN_HOSTS={shown(env['DTRAIN_HOSTS'])}", count)
                 for e in entries]
        current = env["DTRAIN_CURRENT_HOST"].strip()
        current_var = "DTRAIN_CURRENT_HOST"
    elif env.get("SM_HOSTS"):
        source = "SM_HOSTS"
        try:
            names = json.loads(env["SM_HOSTS"])
        except ValueError as e:
            raise UsageError(f"dtrain: SM_HOSTS={shown(env['SM_HOSTS'])} is not JSON: "
                             f"{e}") from None
        if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
            raise UsageError(f"dtrain: SM_HOSTS={shown(env['SM_HOSTS'])} is not a JSON list of "
                             f"host names")
        hosts = [parse_host_entry(n, "SM_HOSTS", count) for n in names]
        if any(":" in n for n in names):
            raise UsageError("dtrain: SM_HOSTS names hosts only; slots come from SM_NUM_GPUS "
                             "or --slots")
        if not env.get("SM_CURRENT_HOST"):
            raise UsageError("dtrain: SM_HOSTS is set but SM_CURRENT_HOST is not")
        current = env["SM_CURRENT_HOST"].strip()
        current_var = "SM_CURRENT_HOST"
    else:
        raise UsageError("dtrain: --cluster needs the list of hosts: set DTRAIN_HOSTS "
                         "(host,host,... or host:slots,...) and DTRAIN_CURRENT_HOST, or SM_HOSTS "
                         "(a JSON list) and SM_CURRENT_HOST")
    seen = set()
    for h in hosts:
        if h.name in seen:
            raise UsageError(f"dtrain: {source} lists host {shown(h.name)} twice")
        seen.add(h.name)
    if current not in seen:
        raise UsageError(f"dtrain: {current_var}={shown(current)} is not one of the hosts in "
                         f"{source} ({describe_names(hosts)})")
    hosts.sort(key=lambda h: natural_key(h.name))
    return ClusterHosts(hosts, current, source)


def describe_names(hosts: List[Host], most: int = 8) -> str:
    text = ", ".join(h.name for h in hosts[:most])
    return text + (f", and {len(hosts) - most} more" if len(hosts) > most else "")


def _send(sock: socket.socket, message: dict) -> None:
    sock.sendall((json.dumps(message) + "\n").encode("utf-8", "surrogateescape"))


def _text(data: bytes) -> str:
    return data.decode("utf-8", "surrogateescape")


class _Lines:
    """JSON messages from a socket, one per line."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.buffer = bytearray()

    def next(self) -> Optional[dict]:
        """The next message; None at end of stream. socket.timeout passes through."""
        while True:
            end = self.buffer.find(b"\n")
            if end >= 0:
                line = bytes(self.buffer[:end])
                del self.buffer[:end + 1]
                return json.loads(line.decode("utf-8", "surrogateescape"))
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                return None
            self.buffer += chunk


class Leader:
    """The status channel's server side (Note [Cluster status channel])."""

    def __init__(self, cluster: ClusterHosts, port: int, program: List[str],
                 rank_hosts: List[str], open_membership: bool = False):
        self.cluster = cluster
        self.program = program
        self.rank_hosts = rank_hosts  # host of every rank, by rank
        # Elastic mode: the hosts of a world are the discovery script's to choose, so any host
        # that runs `dtrainrun --cluster` may follow, including one that joins later.
        self.open_membership = open_membership
        self.connections: Dict[str, socket.socket] = {}
        self.lock = threading.Lock()
        self.arrived = threading.Condition(self.lock)
        self.warnings: List[str] = []
        self.server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.server.bind(("", port))
        except OSError as e:
            self.server.close()
            raise LaunchError(f"dtrain: the leader ({cluster.leader}) cannot listen on port "
                              f"{port}: {e.strerror}; choose another with --cluster-port on "
                              f"every host") from None
        self.server.listen(64)
        self.closing = False
        threading.Thread(target=self._accept, daemon=True).start()
        threading.Thread(target=self._heartbeat, daemon=True).start()

    def _accept(self) -> None:
        while not self.closing:
            try:
                sock, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._greet, args=(sock,), daemon=True).start()

    def _greet(self, sock: socket.socket) -> None:
        sock.settimeout(10)
        try:
            hello = _Lines(sock).next()
        except (OSError, ValueError):
            sock.close()
            return
        host = hello.get("host") if isinstance(hello, dict) else None
        welcome = host in self.cluster.followers or (
            self.open_membership and isinstance(host, str) and host != self.cluster.leader
            and is_host_name(host))
        if not welcome or hello.get("protocol") != PROTOCOL:
            try:
                _send(sock, {"type": "refused",
                             "reason": f"'{host}' is not a follower of this job (followers: "
                                       f"{', '.join(self.cluster.followers)}) or runs another "
                                       f"dtrainrun version"})
            except OSError:
                pass
            sock.close()
            return
        if hello.get("program") != self.program:
            self.warnings.append(
                f"dtrainrun: host {host} was started with the program {hello.get('program')}, "
                f"the leader with {self.program}; the job runs the leader's")
        with self.lock:
            old = self.connections.pop(host, None)
            if old is not None:
                old.close()
            self.connections[host] = sock
            ranks = [r for r, h in enumerate(self.rank_hosts) if h == host]
            try:
                _send(sock, {"type": "welcome", "leader": self.cluster.leader, "ranks": ranks})
            except OSError:
                self.connections.pop(host, None)
            self.arrived.notify_all()

    def set_rank_hosts(self, rank_hosts: List[str]) -> None:
        """A new world (elastic mode): where its ranks run, for LeaderOutput."""
        self.rank_hosts = rank_hosts

    def _heartbeat(self) -> None:
        while not self.closing:
            time.sleep(HEARTBEAT_S)
            self.broadcast({"type": "heartbeat"})

    def wait_for_followers(self, timeout_s: float, output: Output) -> None:
        deadline = time.monotonic() + timeout_s
        with self.lock:
            missing = [h for h in self.cluster.followers if h not in self.connections]
        if missing:  # a note goes to the followers too, so not while holding the lock
            output.note(f"dtrainrun: leader {self.cluster.leader}: waiting for "
                        f"{', '.join(missing)}")
        with self.lock:
            while True:
                missing = [h for h in self.cluster.followers if h not in self.connections]
                left = deadline - time.monotonic()
                if not missing or left <= 0:
                    break
                self.arrived.wait(timeout=min(left, 1.0))
        for warning in self.warnings:
            output.note(warning)
        if missing:
            raise LaunchError(
                f"dtrain: host(s) {', '.join(missing)} did not connect to the leader "
                f"{self.cluster.leader} on port {self.server.getsockname()[1]} within "
                f"{timeout_s:g} s; is `dtrainrun --cluster` running there, and can it reach this "
                f"host on that port?", EXIT_NOT_STARTED)

    def send(self, host: str, message: dict) -> None:
        with self.lock:
            sock = self.connections.get(host)
            if sock is None:
                return
            try:
                _send(sock, message)
            except OSError:
                # A follower that stopped listening does not stop the job; the launcher notices
                # if its host is gone.
                self.connections.pop(host, None)
                sock.close()

    def broadcast(self, message: dict) -> None:
        with self.lock:
            hosts = list(self.connections)
        for host in hosts:
            self.send(host, message)

    def finish(self, code: int, reason: str) -> None:
        """Tells every follower the job's status, and waits (briefly) until each has it."""
        self.closing = True
        self.broadcast({"type": "exit", "code": code, "reason": reason})
        with self.lock:
            connections = list(self.connections.values())
            self.connections.clear()
        for sock in connections:
            try:
                sock.shutdown(socket.SHUT_WR)
                sock.settimeout(5)
                while sock.recv(4096):
                    pass
            except OSError:
                pass
            sock.close()
        self.server.close()


class LeaderOutput(Output):
    """The leader prints every rank's lines, and sends each follower those of its own ranks."""

    def __init__(self, prefix: bool, verbose: bool, leader: Leader):
        super().__init__(prefix, verbose)
        self.leader = leader

    def rank_line(self, rank, stream, line) -> None:
        super().rank_line(rank, stream, line)
        hosts = self.leader.rank_hosts
        here = self.leader.cluster.leader
        if rank is not None and 0 <= rank < len(hosts) and hosts[rank] != here:
            # A long line goes as several messages, one after the other: the follower writes
            # each as it comes, and nothing else goes to its stdout in between.
            head = self.head(rank, stream)
            for chunk in line.chunks():
                self.leader.send(hosts[rank], {"type": "line", "stream": stream,
                                               "data": _text(head + chunk)})
                head = b""

    def note(self, text: str) -> None:
        super().note(text)
        self.leader.broadcast({"type": "note", "text": text})


def follow(cluster: ClusterHosts, port: int, timeout_s: float, program: List[str],
           output: Output) -> int:
    """A follower's whole life: reach the leader, print what it sends, return the job's status."""
    leader = cluster.leader
    deadline = time.monotonic() + timeout_s
    last_error = ""
    announced = False
    while True:
        try:
            sock = socket.create_connection((leader, port), timeout=5)
            break
        except OSError as e:
            last_error = e.strerror or str(e)
        if not announced:
            output.note(f"dtrainrun: {cluster.current} follows leader {leader}; waiting for it "
                        f"on port {port}")
            announced = True
        if time.monotonic() + _CONNECT_RETRY_S > deadline:
            raise LaunchError(
                f"dtrain: the leader {leader} did not answer on port {port} within {timeout_s:g} "
                f"s (last error: {last_error}); is `dtrainrun --cluster` running there, and is "
                f"the port open between the hosts?", EXIT_NOT_STARTED)
        time.sleep(_CONNECT_RETRY_S)
    with sock:
        sock.settimeout(LEADER_SILENCE_S)
        _send(sock, {"type": "hello", "host": cluster.current, "protocol": PROTOCOL,
                     "program": program})
        lines = _Lines(sock)
        while True:
            try:
                message = lines.next()
            except socket.timeout:
                raise LaunchError(f"dtrain: no word from the leader {leader} for "
                                  f"{LEADER_SILENCE_S:g} s; the job's status is unknown",
                                  EXIT_LEADER_LOST) from None
            except (OSError, ValueError) as e:
                raise LaunchError(f"dtrain: the connection to the leader {leader} broke ({e}); "
                                  f"the job's status is unknown", EXIT_LEADER_LOST) from None
            if message is None:
                raise LaunchError(f"dtrain: the leader {leader} went away before the job ended; "
                                  f"its status is unknown", EXIT_LEADER_LOST)
            kind = message.get("type")
            if kind == "welcome":
                ranks = message.get("ranks") or []
                output.note(f"dtrainrun: {cluster.current} joined the job of leader {leader}"
                            + (f"; ranks {ranks[0]}-{ranks[-1]} run here" if ranks else ""))
            elif kind == "refused":
                raise LaunchError(f"dtrain: the leader {leader} refused this host: "
                                  f"{message.get('reason')}", EXIT_NOT_STARTED)
            elif kind == "line":
                data = str(message.get("data", "")).encode("utf-8", "surrogateescape")
                write_all(1 if message.get("stream") == "stdout" else 2, data)
            elif kind == "note":
                output.note(str(message.get("text", "")))
            elif kind == "exit":
                return int(message.get("code", 1))
