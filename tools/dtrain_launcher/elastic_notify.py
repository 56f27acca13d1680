"""The notification server of elastic mode: how the ranks of a running world learn that the hosts
changed and they should stop at their next commit.

Note [Elastic notification protocol]
Environment. Every rank of every world started in elastic mode gets
    DTRAIN_ELASTIC=1
    DTRAIN_ELASTIC_NOTIFY=<address>:<port>   dtrainrun's notification server (split at the last
                                             ':'; the address is an IPv4 address of dtrainrun's
                                             host on the route to the job's hosts, 127.0.0.1
                                             when they are all this machine)
    DTRAIN_ELASTIC_GENERATION=<g>            this world's generation: 0 for the first world, one
                                             more for each world after it (resize or restart)
    DTRAINRUN_RESTART_COUNT=<k>              failures restarted so far (resizes do not count)
    DTRAINRUN_JOB_ID=<id>, DTRAINRUN_ATTEMPT=<g>  the job and its launch, as every job's ranks
                                             (Note [Job identity] in mpi.py); the attempt is
                                             the generation
Request. A TCP connection to DTRAIN_ELASTIC_NOTIFY carries request lines: ASCII, ended by "\n"
(a "\r" before it is ignored), at most MAX_REQUEST_BYTES bytes with the newline. One request is
defined:
    GEN\n
Answer. One line per request:
    GEN <target> <size>\n
  target: decimal, the generation dtrainrun wants running. Equal to DTRAIN_ELASTIC_GENERATION:
          carry on. Greater: the hosts changed; commit at the next step boundary, then every rank
          exits with status 75 (elastic.RESIZE_EXIT_STATUS), after MPI_Finalize. Once a world
          has been told to stop, every later answer to it says so too.
  size:   decimal, the number of ranks the next world would have if it started now (0 when no
          host is offered). Informational: the next world's real size is its MPI size.
Any other line is answered with "ERR <reason>\n" and the connection is closed; so is a line
longer than MAX_REQUEST_BYTES. The server closes a connection after IDLE_TIMEOUT_S without a
request. The intended client is rank 0: at each commit it connects (with a timeout of a few
seconds for the connection and the answer), sends GEN, reads the answer, closes, and broadcasts
(target, size) to the other ranks, so that every rank decides the same at the same step. If
dtrainrun cannot be reached the world carries on: a missing answer is not a resize.
Exit statuses. 75 from the ranks means "resize requested, state committed": dtrainrun starts the
next world on the hosts offered now and uses no restart. dtrainrun takes 75 as that only from a
world it asked to stop; from any other it is a failure like every non-zero status, which uses a
restart (--restarts) and blacklists the host it can be blamed on (Note [Elastic model] in
elastic.py). 0 from every rank ends the job.
Like the --cluster port, the server answers anyone who connects and carries no authentication;
what it tells is only whether a resize is wanted.
"""
from __future__ import annotations

import socket
import socketserver
import threading
from typing import Iterable, Optional, Tuple

from .errors import EXIT_NOT_STARTED, LaunchError

MAX_REQUEST_BYTES = 64
IDLE_TIMEOUT_S = 10.0


class _Handler(socketserver.StreamRequestHandler):
    def setup(self):
        self.request.settimeout(IDLE_TIMEOUT_S)
        super().setup()

    def handle(self):
        server: NotifyServer = self.server.owner  # type: ignore[attr-defined]
        while True:
            try:
                line = self.rfile.readline(MAX_REQUEST_BYTES + 1)
            except OSError:  # idle for too long, or the peer reset the connection
                return
            if not line:
                return
            if len(line) > MAX_REQUEST_BYTES or not line.endswith(b"\n"):
                self._refuse(b"ERR request too long\n")
                return
            words = line.rstrip(b"\r\n").split()
            if words == [b"GEN"]:
                target, size = server.answer()
                if not self._send(f"GEN {target} {size}\n".encode()):
                    return
            else:
                self._refuse(b"ERR unknown request; expected GEN\n")
                return

    def _refuse(self, message: bytes) -> None:
        # Closing with the peer's next lines unread would reset the connection, and a reset can
        # discard the error before the peer reads it: end our side, then read until the peer
        # ends its own (or a second passes).
        if not self._send(message):
            return
        try:
            self.connection.shutdown(socket.SHUT_WR)
            self.connection.settimeout(1.0)
            while self.connection.recv(4096):
                pass
        except OSError:
            pass

    def _send(self, data: bytes) -> bool:
        try:
            self.wfile.write(data)
            self.wfile.flush()
            return True
        except OSError:
            return False


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128


class NotifyServer:
    """Note [Elastic notification protocol], the server's side. It only answers; what it answers
    is set by the elastic loop with start_world() and request_resize()."""

    def __init__(self, port: int = 0):
        try:
            self.server = _Server(("", port), _Handler)
        except OSError as e:
            raise LaunchError(f"dtrain: elastic mode cannot listen on port {port}: "
                              f"{e.strerror}; choose another with --elastic-port",
                              EXIT_NOT_STARTED) from None
        self.server.owner = self  # type: ignore[attr-defined]
        self.lock = threading.Lock()
        self.generation = 0
        self.target = 0
        self.size = 0
        self.stop_answers = 0  # answers that told the running world to stop
        self.thread = threading.Thread(target=self.server.serve_forever,
                                       kwargs={"poll_interval": 0.2}, daemon=True)
        self.thread.start()

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    def start_world(self, generation: int, size: int) -> None:
        with self.lock:
            self.generation = self.target = generation
            self.size = size
            self.stop_answers = 0

    def request_resize(self, target: int, size: int) -> None:
        with self.lock:
            self.target, self.size = target, size

    def answer(self) -> Tuple[int, int]:
        with self.lock:
            if self.target != self.generation:
                self.stop_answers += 1
            return self.target, self.size

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _route_address(host: str) -> Optional[str]:
    """The local IPv4 address this machine would send from to reach `host`: a UDP socket's
    connect() chooses the route without sending anything."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, 9))
            return s.getsockname()[0]
    except OSError:
        return None


def advertised_address(hosts: Iterable[str]) -> str:
    """The address the ranks on `hosts` reach this machine at: the source address of the route to
    the first host that is not this machine; 127.0.0.1 when all of them are (the server listens
    on every address, so either serves ranks here). Names that do not resolve are skipped; with
    none left, this machine's host name."""
    loopback = False
    for host in hosts:
        address = _route_address(host)
        if address is None:
            continue
        if address.startswith("127."):
            loopback = True
            continue
        return address
    return "127.0.0.1" if loopback else socket.gethostname()
