"""Elastic mode's decisions: what the discovery script's answer means, which hosts are
blacklisted, when a world is started, resized, restarted, waited for or given up, and which host
each rank of a new world runs on. Nothing here starts a process, opens a socket or reads a clock
of its own (the clock is passed in), so every decision can be tested step by step;
elastic_run.py does the running and elastic_notify.py talks to the ranks.

Note [Elastic model]
A job runs as a sequence of worlds, numbered by generation (0, 1, ...). Each world is one run of
the MPI launcher over the hosts the discovery script offered when it started, with
min(--max-np, available slots) ranks. A world ends in one of three ways:
  - every rank exits 0: the job is done;
  - a resize: the hosts changed while it ran, dtrainrun asked it to stop (elastic_notify.py), and
    it exited with RESIZE_EXIT_STATUS after committing its state. The next world starts on the
    hosts offered now, resumes from that commit, and no restart is used;
  - a failure (any other non-zero status, a rank killed, ranks that never started): the host to
    blame, if one can be named (_blame), is blacklisted (Note [Blacklist cooldown]), one restart
    of --restarts is used, and the next world resumes from the last commit. Once more failures
    than --restarts have happened the job ends as a non-elastic one would.
A world starts only when enough slots are offered: -np (default --min-np) for the first world,
--min-np for later ones. While fewer are offered dtrainrun waits, asking the script again; after
--elastic-timeout seconds of waiting the job ends with EXIT_ELASTIC_TIMEOUT. The first world may
start with fewer than -np ranks once the timeout has passed, as long as --min-np slots are there:
-np is the size a job hopes to start with, --min-np the size it cannot run below.

Note [Stable ranks]
Ranks fill hosts in layout order (hosts.fill), so a rank keeps its number in the next world when
its host and every host before it keep their place and rank count. plan_layout() keeps as much
of that as it can: the hosts that stay keep their order and their rank counts (less if their
slots shrank), a new host takes the place of a host that left (the first newcomer in the first
gap), further newcomers go to the end, and ranks beyond the kept counts fill spare slots in
layout order. Rank 0 stays on its host for as long as that host stays, which keeps rank 0's
local commits and logs where they were.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Set, Tuple, Union

from .errors import EXIT_RESTARTS_EXHAUSTED, UsageError, shown
from .hosts import Host, describe, parse_host_entry, rank_hosts, total_slots
from .limits import MAX_RANKS, MAX_RANKS_WHY

# A rank's exit status for "a resize was requested and my state is committed": EX_TEMPFAIL of
# sysexits.h, "temporary failure; the user is invited to retry", which is what it asks of
# dtrainrun. Shared with the ranks (Note [Elastic notification protocol] in elastic_notify.py).
RESIZE_EXIT_STATUS = 75

# dtrainrun's own exit status when fewer than --min-np slots were offered for --elastic-timeout.
EXIT_ELASTIC_TIMEOUT = 123

# Note [Blacklist cooldown]
# A host blamed for a failure stays out of new worlds for a cooldown. Its n-th failure in a row
# keeps it out for cooldown * 2**(n-1), at most cooldown * 2**MAX_COOLDOWN_DOUBLINGS. The count
# starts again once the host has been back for as long as that longest cooldown without being
# blamed again. The reasons: one failure says little (a preempted process, a full disk cleaned up
# since), so the first cooldown is short and a repaired host returns soon; a host that fails each
# time it returns (flapping) costs a restart and the work since the last commit every time, so
# each return is made twice as rare; and a host that has run as long as its longest ban without
# failing has shown what a new host would, so it is treated as one. The cap keeps a host that was
# fixed from being lost for the rest of a long job (with the default 60 s: at most 32 minutes).
# The cooldown is deterministic (no jitter): one dtrainrun decides for the whole job, so there is
# no herd of clients to spread out. --blacklist-cooldown 0 turns blacklisting off.
MAX_COOLDOWN_DOUBLINGS = 5

Clock = Callable[[], float]


class DiscoveryError(Exception):
    """The discovery script's answer could not be used; the text says why."""


def parse_discovery(text: str, default_slots: int = 1) -> List[Host]:
    """The hosts of a discovery script's output: one `host:slots` or `host` per line (a bare host
    has `default_slots`), as Horovod's scripts print them. Blank lines and '#' comments are
    skipped. Any other line makes the whole answer unusable: a script that printed an error among
    its hosts may have left hosts out, and acting on a partial list would shrink a running job
    for nothing. Zero hosts is a valid answer (nothing is offered now)."""
    hosts: List[Host] = []
    seen: Set[str] = set()
    for number, raw in enumerate(text.split("\n"), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        odd = next((c for c in line if "\udc80" <= c <= "\udcff"), None)
        if odd is not None:
            raise DiscoveryError(f"line {number}: byte 0x{ord(odd) - 0xdc00:02x} is not UTF-8 "
                                 f"text; expected host:slots")
        if len(line.split()) != 1:
            raise DiscoveryError(f"line {number}: {shown(line)} is not host:slots")
        try:
            host = parse_host_entry(line, f"line {number}", default_slots)
        except UsageError as e:
            raise DiscoveryError(str(e)[len("dtrain: "):]) from None
        if host.name in seen:
            raise DiscoveryError(f"line {number}: host {shown(host.name)} is listed twice")
        seen.add(host.name)
        hosts.append(host)
        if len(hosts) > MAX_RANKS:
            raise DiscoveryError(f"more than {MAX_RANKS} hosts ({MAX_RANKS_WHY}, each on a "
                                 f"host)")
    return hosts


def describe_change(before: Optional[List[Host]], after: List[Host]) -> str:
    """What changed between two discovery answers, for a note: '' when nothing did."""
    if before is None:
        return ""
    old = {h.name: h.slots for h in before}
    new = {h.name: h.slots for h in after}
    parts = [f"+{h}" for h in after if h.name not in old]
    parts += [f"-{h}" for h in before if h.name not in new]
    parts += [f"{h.name} {old[h.name]}->{h.slots} slots" for h in after
              if h.name in old and old[h.name] != h.slots]
    return ", ".join(parts)


@dataclass
class _Ban:
    failures: int  # in a row (Note [Blacklist cooldown])
    until: float


class Blacklist:
    """Hosts kept out of new worlds after failures, with Note [Blacklist cooldown]'s rule."""

    def __init__(self, cooldown_s: float):
        self.cooldown_s = cooldown_s
        self.longest_s = cooldown_s * 2 ** MAX_COOLDOWN_DOUBLINGS
        self.bans: Dict[str, _Ban] = {}

    def add(self, host: str, now: float) -> Tuple[float, int]:
        """Blames `host` for a failure: (its cooldown in seconds, its failures in a row)."""
        if self.cooldown_s <= 0:
            return 0.0, 0
        ban = self.bans.get(host)
        if ban is None or now - ban.until >= self.longest_s:
            ban = self.bans[host] = _Ban(0, now)
        ban.failures += 1
        cooldown = self.cooldown_s * 2 ** min(ban.failures - 1, MAX_COOLDOWN_DOUBLINGS)
        ban.until = max(ban.until, now + cooldown)
        return cooldown, ban.failures

    def is_out(self, host: str, now: float) -> bool:
        ban = self.bans.get(host)
        return ban is not None and now < ban.until

    def out(self, now: float) -> Dict[str, float]:
        """The hosts kept out now, with the seconds left of their cooldowns."""
        return {h: ban.until - now for h, ban in self.bans.items() if now < ban.until}


def plan_layout(previous: Optional[Sequence[Host]], available: Sequence[Host],
                size: int) -> List[Host]:
    """The layout (hosts with their rank counts, in rank order) of a world of `size` ranks on
    `available` (hosts with their slots, in the discovery script's order), kept as close to
    `previous` as Note [Stable ranks] allows. `size` must not exceed the available slots."""
    slots = {h.name: h.slots for h in available}
    previous = list(previous or [])
    before = {h.name for h in previous}
    newcomers = [h.name for h in available if h.name not in before]
    order: List[str] = []
    counts: Dict[str, int] = {}
    for h in previous:
        if h.name in slots:
            order.append(h.name)
            counts[h.name] = min(h.slots, slots[h.name])
        elif newcomers:  # a new host takes the place of one that left
            order.append(newcomers.pop(0))
    order += newcomers
    kept = sum(counts.values())
    if kept > size:  # fewer ranks than the hosts that stay ran: keep the first ones
        left = size
        for name in order:
            counts[name] = min(counts.get(name, 0), left)
            left -= counts[name]
    else:
        extra = size - kept
        for name in order:
            more = min(slots[name] - counts.get(name, 0), extra)
            counts[name] = counts.get(name, 0) + more
            extra -= more
    return [Host(name, counts[name]) for name in order if counts.get(name, 0) > 0]


@dataclass(frozen=True)
class Settings:
    min_np: int
    max_np: int
    start_np: int          # slots the first world waits for (-np, default min_np)
    restarts: int          # failures that may be restarted (--restarts)
    elastic_timeout_s: float
    cooldown_s: float      # --blacklist-cooldown


@dataclass
class Launch:
    """Start this world."""
    generation: int
    layout: List[Host]
    restart_count: int     # failures restarted so far
    note: str = ""         # something to tell the user first ('' for nothing)


@dataclass
class Wait:
    """Not enough slots: ask the script again later. `message` changes only when what is offered
    does, so that it can be printed once per change."""
    message: str
    left_s: float


@dataclass
class Finish:
    """The job is over: exit with `code` after printing `message` ('' for nothing)."""
    code: int
    message: str = ""


@dataclass
class Continue:
    """The world ended and another one follows; `message` says why."""
    message: str


@dataclass
class Outcome:
    """How a world ended, as far as the ranks' records tell (job.Attempt)."""
    code: int
    reason: str = ""
    interrupted: bool = False
    failed_rank: Optional[int] = None       # the first rank that reported a failure
    never_started: Sequence[int] = field(default_factory=list)


def counted(n: int, word: str) -> str:
    """'1 slot', '2 slots'."""
    return f"{n} {word}" + ("" if n == 1 else "s")


def ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


class Elastic:
    """The state of an elastic job between and during its worlds (Note [Elastic model])."""

    def __init__(self, settings: Settings, clock: Clock):
        self.settings = settings
        self.clock = clock
        self.blacklist = Blacklist(settings.cooldown_s)
        self.discovered_hosts: Optional[List[Host]] = None
        self.generation = -1                     # of the world running or last run
        self.running: Optional[List[Host]] = None
        self.last_layout: Optional[List[Host]] = None
        self.resize_pending = False              # the running world was asked to stop
        self.failures = 0
        self.resizes = 0
        self.wait_since: Optional[float] = None
        self.last_failure = ""

    # What the discovery script offers.

    def discovered(self, hosts: List[Host]) -> str:
        """Takes a discovery answer; returns what changed ('' for nothing, and for the first)."""
        change = describe_change(self.discovered_hosts, hosts)
        self.discovered_hosts = list(hosts)
        return change

    def available(self) -> List[Host]:
        now = self.clock()
        return [h for h in self.discovered_hosts or [] if not self.blacklist.is_out(h.name, now)]

    def _size_for(self, available: List[Host]) -> int:
        return min(self.settings.max_np, total_slots(available))

    # Between worlds.

    def next_world(self) -> Union[Launch, Wait, Finish]:
        s = self.settings
        now = self.clock()
        first = self.generation < 0
        needed = s.start_np if first else s.min_np
        available = self.available()
        slots = total_slots(available)
        waited = 0.0 if self.wait_since is None else now - self.wait_since
        note = ""
        if first and slots < needed and slots >= s.min_np and waited >= s.elastic_timeout_s:
            note = (f"dtrainrun: elastic: {counted(slots, 'slot')} after waiting "
                    f"{s.elastic_timeout_s:g} s for {needed} (-np); starting with them (--min-np "
                    f"{s.min_np})")
            needed = s.min_np
        if slots >= needed:
            size = self._size_for(available)
            layout = plan_layout(self.last_layout, available, size)
            self.generation += 1
            self.running = self.last_layout = layout
            self.resize_pending = False
            self.wait_since = None
            return Launch(self.generation, layout, self.failures, note)
        if self.wait_since is None:
            self.wait_since, waited = now, 0.0
        what = "-np" if first and needed == s.start_np and s.start_np != s.min_np else "--min-np"
        offered = (f"{slots} available ({describe(available)})" if available else
                   "none available")
        banned = self.blacklist.out(now)
        if banned:
            offered += "; blacklisted after failures: " + ", ".join(sorted(banned))
        wanted = f"{counted(needed, 'slot')} ({what} {needed})"
        if waited >= s.elastic_timeout_s:
            why = f"; the last failure: {self.last_failure}" if banned and self.last_failure else ""
            return Finish(EXIT_ELASTIC_TIMEOUT,
                          f"dtrain: elastic: fewer than {wanted} for {s.elastic_timeout_s:g} s "
                          f"(--elastic-timeout): {offered}{why}; exiting with "
                          f"{EXIT_ELASTIC_TIMEOUT}")
        return Wait(f"dtrainrun: elastic: waiting for {wanted}: {offered}",
                    s.elastic_timeout_s - waited)

    # While a world runs.

    def resize_target(self) -> Optional[Tuple[int, int]]:
        """After a discovery answer while a world runs: (generation wanted, its size) when the
        world should stop for a resize, else None. Once asked, a world stays asked, so a rank
        that saw the request and exits with RESIZE_EXIT_STATUS is never mistaken for a failure;
        the size follows the latest answer."""
        if self.running is None:
            return None
        available = self.available()
        size = self._size_for(available)
        if not self.resize_pending:
            if plan_layout(self.running, available, size) == self.running:
                return None
            self.resize_pending = True
        return self.generation + 1, size

    def planned_size(self) -> int:
        return self._size_for(self.available())

    # After a world.

    def ended(self, outcome: Outcome) -> Union[Finish, Continue]:
        """Takes how the running world ended (after a fresh discovery answer, so that a lost
        host is known as such)."""
        s = self.settings
        layout, generation = self.running or [], self.generation
        pending, self.running, self.resize_pending = self.resize_pending, None, False
        if outcome.interrupted:
            return Finish(outcome.code, f"dtrainrun: {outcome.reason}; exiting with "
                                        f"{outcome.code}")
        if outcome.code == 0:
            if generation == 0:
                return Finish(0)
            return Finish(0, f"dtrainrun: the job succeeded in generation {generation}, after "
                             f"{self.resizes} resize(s) and {self.failures} restart(s)")
        if outcome.code == RESIZE_EXIT_STATUS and pending:
            self.resizes += 1
            return Continue(f"dtrainrun: elastic: generation {generation} committed its state "
                            f"and stopped for a resize (resizes do not use --restarts)")
        reason = outcome.reason
        if outcome.code == RESIZE_EXIT_STATUS:
            reason += (f" (exit status {RESIZE_EXIT_STATUS} asks for a resize, but none was "
                       f"requested)")
        self.failures += 1
        self.last_failure = reason
        blamed, why = self._blame(layout, outcome)
        now = self.clock()
        bans = []
        for host in blamed:
            cooldown, count = self.blacklist.add(host, now)
            if cooldown > 0:
                bans.append(f"{host} blacklisted for {cooldown:g} s ({why}, its {ordinal(count)} "
                            f"failure in a row)")
        banned = "; " + "; ".join(bans) if bans else ""
        if self.failures > s.restarts:
            if s.restarts > 0:
                return Finish(EXIT_RESTARTS_EXHAUSTED,
                              f"dtrain: the job failed {self.failures} times, the last time "
                              f"because {reason}; no restarts left (--restarts {s.restarts}); "
                              f"exiting with {EXIT_RESTARTS_EXHAUSTED}")
            return Finish(outcome.code, f"dtrainrun: job failed: {reason}; exiting with "
                                        f"{outcome.code}")
        return Continue(f"dtrainrun: restart {self.failures} of {s.restarts}: {reason}{banned}")

    def _blame(self, layout: List[Host], outcome: Outcome) -> Tuple[List[str], str]:
        """The hosts a failure is attributed to, and why. In order: hosts of the world that the
        script no longer lists (a lost host makes the survivors fail too, often first, so they
        are not blamed); hosts where no rank started, when ranks started elsewhere (unreachable
        hosts; when none started anywhere the cause is more likely the program or the launcher);
        the host of the first rank that reported a failure. Otherwise nobody."""
        listed = {h.name for h in self.discovered_hosts or []}
        names = [h.name for h in layout]
        lost = [n for n in names if n not in listed]
        if lost:
            return lost, "no longer offered by the discovery script"
        placement = rank_hosts(layout)
        if outcome.never_started:
            silent = set(outcome.never_started)
            idle = [n for n in names
                    if all(r in silent for r, h in enumerate(placement) if h == n)]
            if idle and len(idle) < len(names):
                return idle, "its ranks did not start"
        rank = outcome.failed_rank
        if rank is not None and 0 <= rank < len(placement):
            return [placement[rank]], f"rank {rank} failed there"
        return [], ""
