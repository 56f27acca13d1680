"""Reads a run's profile files (one JSON Lines file per rank) into memory.

Every problem with the input is either fatal (nothing usable: ProfileError, with a message that
says what to do) or recorded in Run.skipped, which the report prints: a foreign or newer file, a
line that is not JSON, a truncated last line, a file from another run, a duplicate or missing
rank. The schema is Note [Profile schema] in include/dtrain/profile/records.hpp.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from . import SUPPORTED_FORMAT_VERSION

PROFILE_FORMAT = "dtrain-profile"


class ProfileError(Exception):
    """Nothing could be reported; the message says why and what to do."""


@dataclass
class Step:
    index: int
    t: float  # seconds since the run's start, at the start of the step
    duration_ms: float
    phases_ms: dict[str, float]
    other_ms: float
    samples: int
    engine: dict[str, float] | None

    def phase(self, name: str) -> float:
        return self.phases_ms.get(name, 0.0)

    @property
    def busy_ms(self) -> float:
        """The step without its communication wait: the rank's own work."""
        return max(0.0, self.duration_ms - self.phase("communication_wait"))


@dataclass
class RankProfile:
    path: Path
    header: dict
    steps: list[Step] = field(default_factory=list)
    samples: list[dict] = field(default_factory=list)
    closed: bool = False  # the file ends with an "end" record
    phases_outside_steps: int = 0

    @property
    def rank(self) -> int:
        return int(self.header["rank"])

    @property
    def size(self) -> int:
        return int(self.header["size"])

    @property
    def host(self) -> str:
        return str(self.header.get("host", "?"))

    @property
    def run_id(self) -> str:
        return str(self.header.get("run_id", ""))

    @property
    def cpu_count(self) -> int:
        return int(self.header.get("cpu_count") or 0)

    @property
    def gpu(self) -> dict:
        g = self.header.get("gpu")
        return g if isinstance(g, dict) else {"available": False, "reason": "not recorded"}


@dataclass
class Run:
    ranks: dict[int, RankProfile]
    size: int
    run_id: str
    source: str
    skipped: list[str] = field(default_factory=list)

    @property
    def hosts(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for r in sorted(self.ranks):
            out.setdefault(self.ranks[r].host, []).append(r)
        return out


_REQUIRED_HEADER = {"rank": int, "size": int}
_STEP_FIELDS = ("step", "t", "duration_ms")


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _read_header(path: Path, first_line: str) -> tuple[dict | None, str]:
    """The header, or None and why the file is not a profile this reader can use."""
    try:
        h = json.loads(first_line)
    except json.JSONDecodeError:
        return None, "not a dtrain profile (its first line is not JSON)"
    if not isinstance(h, dict) or h.get("type") != "header" or h.get("format") != PROFILE_FORMAT:
        return None, "not a dtrain profile (its first line is not a dtrain-profile header)"
    version = h.get("version")
    if not isinstance(version, int) or version < 1:
        return None, f"a dtrain profile with an unreadable format version ({version!r})"
    if version > SUPPORTED_FORMAT_VERSION:
        return None, (f"written by a newer dtrain (format version {version}; this dtrain-report "
                      f"reads version {SUPPORTED_FORMAT_VERSION}): use that dtrain's dtrain-report")
    for key, kind in _REQUIRED_HEADER.items():
        if not isinstance(h.get(key), kind) or isinstance(h.get(key), bool):
            return None, f"a dtrain profile header without a valid {key!r}"
    if h["size"] < 1 or not 0 <= h["rank"] < h["size"]:
        return None, f"a dtrain profile header with rank {h['rank']} of size {h['size']}"
    return h, ""


def _step_from(record: dict) -> Step | None:
    if not all(_is_number(record.get(k)) for k in _STEP_FIELDS):
        return None
    phases = record.get("phases_ms", {})
    if not isinstance(phases, dict):
        return None
    phases = {str(k): float(v) for k, v in phases.items() if _is_number(v)}
    engine = record.get("engine")
    if engine is not None:
        engine = {str(k): float(v) for k, v in engine.items() if _is_number(v)} \
            if isinstance(engine, dict) else None
    other = record.get("other_ms", 0.0)
    samples = record.get("samples", 0)
    return Step(index=int(record["step"]), t=float(record["t"]),
                duration_ms=float(record["duration_ms"]), phases_ms=phases,
                other_ms=float(other) if _is_number(other) else 0.0,
                samples=int(samples) if _is_number(samples) else 0, engine=engine)


def read_rank_file(path: Path, skipped: list[str]) -> RankProfile | None:
    """One rank's file; None (with the reason in `skipped`) when it is not usable at all."""
    try:
        data = path.read_bytes()
    except OSError as e:
        skipped.append(f"{path.name}: cannot be read ({e.strerror or e})")
        return None
    text = data.decode("utf-8", errors="replace")
    if not text.strip():
        skipped.append(f"{path.name}: empty (the profiler was started but wrote nothing)")
        return None
    lines = text.split("\n")
    truncated_tail = lines[-1] != ""  # the last line has no newline: cut short mid-line
    if not truncated_tail:
        lines.pop()
    header, why = _read_header(path, lines[0])
    if header is None:
        skipped.append(f"{path.name}: {why}")
        return None
    profile = RankProfile(path=path, header=header)
    bad_lines: list[int] = []
    unknown = 0
    for number, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue  # padding that keeps writes within a page (Note [Complete lines only])
        last = number == len(lines)
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if last and truncated_tail:
                skipped.append(f"{path.name}: its last line (line {number}) is cut short, as when "
                               f"a process dies while writing; the line was left out")
            else:
                bad_lines.append(number)
            continue
        if not isinstance(record, dict):
            bad_lines.append(number)
            continue
        kind = record.get("type")
        if kind == "step":
            step = _step_from(record)
            if step is None:
                bad_lines.append(number)
            else:
                profile.steps.append(step)
        elif kind == "sample":
            if _is_number(record.get("t")):
                profile.samples.append(record)
            else:
                bad_lines.append(number)
        elif kind == "stop":
            n = record.get("phases_outside_steps", 0)
            profile.phases_outside_steps += int(n) if _is_number(n) else 0
        elif kind == "end":
            profile.closed = True
        elif kind in ("start", "header"):
            pass
        else:
            unknown += 1
    if bad_lines:
        shown = ", ".join(str(n) for n in bad_lines[:10]) + (" ..." if len(bad_lines) > 10 else "")
        skipped.append(f"{path.name}: {len(bad_lines)} line(s) that are not valid profile records "
                       f"were left out (line {shown})")
    if unknown:
        skipped.append(f"{path.name}: {unknown} record(s) of a type this report does not know "
                       f"were ignored")
    if not profile.closed:
        last_step = profile.steps[-1].index if profile.steps else None
        skipped.append(f"{path.name}: rank {profile.rank}'s profile has no end record: the process "
                       f"stopped without closing its Profiler (crashed or killed?)"
                       + (f"; its last recorded step is {last_step}" if last_step is not None
                          else ""))
    profile.steps.sort(key=lambda s: s.index)
    profile.samples.sort(key=lambda s: s["t"])
    return profile


def profile_files(paths: list[Path]) -> list[Path]:
    """The files to read: each folder's *.jsonl files, and files given by name."""
    files: list[Path] = []
    for p in paths:
        if p.is_dir():
            found = sorted(p.glob("*.jsonl"))
            if not found:
                raise ProfileError(
                    f"no profile files (*.jsonl) in '{p}': run the training with "
                    f"DTRAIN_PROFILE={p} (or ProfilerOptions::dir) so that every rank writes "
                    f"rank-<r>.jsonl there")
            files.extend(found)
        elif p.is_file():
            files.append(p)
        else:
            raise ProfileError(f"'{p}' does not exist: name the folder given to DTRAIN_PROFILE, "
                               f"or profile files in it")
    return files


def load_run(paths: list[Path]) -> Run:
    """All ranks of one run. The newest run wins when files from several runs are given."""
    skipped: list[str] = []
    profiles = [p for p in (read_rank_file(f, skipped) for f in profile_files(paths)) if p]
    source = ", ".join(str(p) for p in paths)
    if not profiles:
        raise ProfileError("nothing to report from " + source + ": "
                           + "; ".join(skipped or ["no readable profile"]))
    by_run: dict[str, list[RankProfile]] = {}
    for p in profiles:
        by_run.setdefault(p.run_id, []).append(p)
    run_id = max(by_run, key=lambda r: max(float(p.header.get("start_unix_ms") or 0)
                                           for p in by_run[r]))
    for other, members in by_run.items():
        if other == run_id:
            continue
        for p in members:
            skipped.append(f"{p.path.name}: from another run (run id {other or '?'}) than the "
                           f"newest one ({run_id}); not merged")
    ranks: dict[int, RankProfile] = {}
    for p in sorted(by_run[run_id], key=lambda p: str(p.path)):
        if p.rank in ranks:
            skipped.append(f"{p.path.name}: a second file for rank {p.rank} "
                           f"(after {ranks[p.rank].path.name}); not merged")
            continue
        ranks[p.rank] = p
    size = max(p.size for p in ranks.values())
    for p in ranks.values():
        if p.size != size:
            skipped.append(f"{p.path.name}: says the run had {p.size} ranks, others say {size}")
    missing = [r for r in range(size) if r not in ranks]
    if missing:
        skipped.append(f"no profile for rank(s) {', '.join(map(str, missing))} of {size}: the "
                       f"report covers the other ranks only")
    return Run(ranks=ranks, size=size, run_id=run_id, source=source, skipped=skipped)
