"""Hosts and slots: the -H list, hostfiles, and how ranks fill the hosts."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, List, Optional

from .errors import UsageError, shown
from .limits import MAX_HOSTFILE_BYTES, MAX_RANKS, MAX_RANKS_WHY, parse_count

# Host names and IPv4 addresses: what DNS, /etc/hosts and the MPI launchers all accept.
_HOST_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class Host:
    name: str
    slots: int

    def __str__(self) -> str:
        return f"{self.name}:{self.slots}"


def describe(hosts: Iterable[Host], most: int = 8) -> str:
    """`host:slots, ...` for a message; after `most` hosts, how many more there are."""
    hosts = list(hosts)
    text = ", ".join(str(h) for h in hosts[:most])
    return text + (f", and {len(hosts) - most} more hosts" if len(hosts) > most else "")


def natural_key(name: str):
    """Sort key that orders algo-2 before algo-10: digit runs compare as numbers (by length
    without leading zeros, then digit by digit, so that a run of any length compares)."""
    key = []
    for i, part in enumerate(re.split(r"([0-9]+)", name)):
        if i % 2 == 1:  # the split's captured digit runs
            significant = part.lstrip("0")
            key.append((0, len(significant), significant, part))
        elif part:
            key.append((1, 0, part, part))
    return key


def is_host_name(name: str) -> bool:
    return _HOST_NAME.match(name) is not None


def check_host_name(name: str, where: str) -> None:
    if not _HOST_NAME.match(name):
        raise UsageError(
            f"dtrain: {where}: {shown(name)} is not a host name; expected letters, digits, '.', "
            f"'-' and '_' (a DNS name or an IPv4 address)")


def parse_slots(text: str, host: str, where: str) -> int:
    slots = parse_count(text, MAX_RANKS)
    if slots is None:
        raise UsageError(
            f"dtrain: {where}: host '{host}' has slots {shown(text)}; slots must be a whole number "
            f"of at least 1")
    if slots > MAX_RANKS:
        raise UsageError(
            f"dtrain: {where}: host '{host}' has {shown(text, quote='')} slots; a host has 1 to "
            f"{MAX_RANKS} ({MAX_RANKS_WHY})")
    if slots < 1:
        raise UsageError(
            f"dtrain: {where}: host '{host}' has {slots} slots; every host needs at least 1 "
            f"(leave a host out instead of giving it 0)")
    return slots


def parse_host_entry(entry: str, where: str, default_slots: int = 1) -> Host:
    """`host` or `host:slots`."""
    entry = entry.strip()
    if entry == "":
        raise UsageError(f"dtrain: {where}: empty host entry; expected host or host:slots, "
                         f"separated by commas")
    name, sep, slots_text = entry.partition(":")
    if sep and ":" in slots_text:
        raise UsageError(f"dtrain: {where}: {shown(entry)} is not host or host:slots (IPv6 "
                         f"addresses are not supported; use a host name)")
    check_host_name(name, where)
    slots = parse_slots(slots_text, name, where) if sep else default_slots
    return Host(name, slots)


def check_unique(hosts: List[Host], where: str) -> List[Host]:
    seen = set()
    for host in hosts:
        if host.name in seen:
            raise UsageError(f"dtrain: {where}: host '{host.name}' is listed twice; give it once "
                             f"with all its slots (host:slots)")
        seen.add(host.name)
    return hosts


def parse_host_list(text: str, where: str = "-H") -> List[Host]:
    """The -H argument: `host:slots,host:slots,...`; a host without slots has 1 (as in Horovod)."""
    where = f"{where} {shown(text)}"
    hosts = [parse_host_entry(e, where) for e in text.split(",")]
    return check_unique(hosts, where)


def parse_hostfile_text(text: str, path: str) -> List[Host]:
    """Hostfile lines: `host slots=N` (Open MPI's form), `host:N` (MPICH's form) or `host`;
    '#' starts a comment."""
    hosts = []
    for number, raw in enumerate(text.split("\n"), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"--hostfile {path} line {number}"
        odd = next((c for c in line if "\udc80" <= c <= "\udcff"), None)
        if odd is not None:
            raise UsageError(f"dtrain: {where}: byte 0x{ord(odd) - 0xdc00:02x} is not UTF-8 text; "
                             f"a hostfile is plain text: host names, slots and comments")
        words = line.split()
        if len(words) == 1:
            hosts.append(parse_host_entry(words[0], where))
            continue
        if len(words) == 2 and words[1].startswith("slots="):
            check_host_name(words[0], where)
            hosts.append(Host(words[0], parse_slots(words[1][len("slots="):], words[0], where)))
            continue
        raise UsageError(f"dtrain: {where}: {shown(line)} is not 'host slots=N', 'host:N' or "
                         f"'host'")
    if len(hosts) > MAX_RANKS:
        raise UsageError(f"dtrain: --hostfile {path} lists {len(hosts)} hosts; at most "
                         f"{MAX_RANKS} ({MAX_RANKS_WHY}, each on a host)")
    if not hosts:
        raise UsageError(f"dtrain: --hostfile {path} lists no hosts")
    return check_unique(hosts, f"--hostfile {path}")


def read_hostfile(path: str) -> List[Host]:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_HOSTFILE_BYTES + 1)
    except OSError as e:
        raise UsageError(f"dtrain: --hostfile {path}: cannot read it: {e.strerror}") from None
    if len(data) > MAX_HOSTFILE_BYTES:
        raise UsageError(f"dtrain: --hostfile {path}: larger than {MAX_HOSTFILE_BYTES >> 20} MiB; "
                         f"a hostfile lists hosts, one per line")
    # Undecodable bytes are kept (as surrogates) so that the line they are on can be named; a
    # comment may hold anything.
    return parse_hostfile_text(data.decode("utf-8", "surrogateescape"), path)


def total_slots(hosts: Iterable[Host]) -> int:
    return sum(h.slots for h in hosts)


def fill(hosts: List[Host], np: int) -> List[Host]:
    """The hosts the ranks run on, in order, with how many ranks each gets: ranks fill each
    host's slots before the next host (rank r runs on the host whose slots contain r), which is
    how both Hydra (-hosts h:n) and Open MPI (--map-by slot) place them."""
    used = []
    left = np
    for host in hosts:
        if left == 0:
            break
        take = min(host.slots, left)
        used.append(Host(host.name, take))
        left -= take
    return used


def rank_hosts(layout: List[Host]) -> List[str]:
    """Host name of every rank, by rank, for a layout from fill()."""
    return [h.name for h in layout for _ in range(h.slots)]


def layout_text(layout: List[Host]) -> str:
    """'node1 (ranks 0-3), node2 (rank 4)' for a layout from fill()."""
    parts, first = [], 0
    for h in layout:
        last = first + h.slots - 1
        ranks = f"rank {first}" if first == last else f"ranks {first}-{last}"
        parts.append(f"{h.name} ({ranks})")
        first = last + 1
    return ", ".join(parts)


def find(hosts: List[Host], name: str) -> Optional[Host]:
    return next((h for h in hosts if h.name == name), None)
