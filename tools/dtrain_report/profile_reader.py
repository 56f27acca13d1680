"""Reads a run's profile files (one JSON Lines file per rank) into memory.

Every problem with the input is either fatal (nothing usable: ProfileError, with a message that
says what to do) or recorded in Run.skipped, which the report prints: a foreign or newer file, a
file that is not a regular one, a line that is not JSON, a truncated last line, a duplicate or
missing rank. Other runs in the folder are listed in Run.other_runs (run_files.py chooses the
run). The schema is Note [Profile schema] in include/dtrain/profile/records.hpp.
"""

from __future__ import annotations

import gc
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from . import SUPPORTED_FORMAT_VERSION
from .run_files import NotRegular, ProfileFile, RunFiles, choose_run, find_files, group_runs, \
    not_regular_note, read_regular

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
    label: str = ""  # how messages name the file: relative to the folder given
    steps: list[Step] = field(default_factory=list)
    samples: list[dict] = field(default_factory=list)
    closed: bool = False  # the file ends with an "end" record
    phases_outside_steps: int = 0
    start_steps: list[int] = field(default_factory=list)  # the step each "start" mark names
    last_t: float = 0.0  # the latest time any record of the file reaches (steps: their end)

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
    def name(self) -> str:
        return self.label or self.path.name

    @property
    def cpu_count(self) -> int:
        return int(self.header.get("cpu_count") or 0)

    @property
    def gpu(self) -> dict:
        g = self.header.get("gpu")
        return g if isinstance(g, dict) else {"available": False, "reason": "not recorded"}

    @property
    def recorded_from_first_step(self) -> bool:
        """Whether recording began before step 0, so that the first recorded step is the
        program's first step (ProfilerOptions::start_recording = false defers it)."""
        return not self.start_steps or min(self.start_steps) == 0


@dataclass
class Run:
    ranks: dict[int, RankProfile]
    size: int
    run_id: str
    source: str
    skipped: list[str] = field(default_factory=list)
    job_id: str | None = None  # DTRAINRUN_JOB_ID and DTRAINRUN_ATTEMPT, under dtrainrun
    attempt: int | None = None
    other_runs: list[RunFiles] = field(default_factory=list)  # found and not read, oldest first
    chosen: str = ""  # why this run: "the newest", "chosen with --run ID", ...

    @property
    def title(self) -> str:
        """The run id, with its job and attempt under dtrainrun."""
        if self.job_id is None:
            return self.run_id
        attempt = f", attempt {self.attempt}" if self.attempt is not None else ""
        return f"{self.run_id} (job {self.job_id}{attempt})"

    @property
    def hosts(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for r in sorted(self.ranks):
            out.setdefault(self.ranks[r].host, []).append(r)
        return out

    @property
    def unclosed(self) -> list[int]:
        """Ranks whose file has no end record: the process was killed or crashed."""
        return [r for r in sorted(self.ranks) if not self.ranks[r].closed]

    @property
    def has_steps(self) -> bool:
        return any(p.steps for p in self.ranks.values())


def number_ranges(numbers, most: int = 8) -> str:
    """'0-3, 5, 9-12' for a set of integers; long lists end in '... (N in all)'."""
    xs = sorted(set(numbers))
    parts, i = [], 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        parts.append(str(xs[i]) if i == j else f"{xs[i]}-{xs[j]}")
        i = j + 1
    if len(parts) > most:
        return ", ".join(parts[:most]) + f" ... ({len(xs)} in all)"
    return ", ".join(parts)


_REQUIRED_HEADER = {"rank": int, "size": int}
_STEP_FIELDS = ("step", "t", "duration_ms")
# Header fields the report computes with; one that is not a number is dropped with a note.
_NUMERIC_HEADER = ("cpu_count", "affinity_cpus", "sample_interval_ms", "start_unix_ms",
                   "process_uptime_ms", "local_rank", "local_size", "pid")
_NUMERIC_GPU = ("index", "memory_total_bytes")


def _is_number(v) -> bool:
    """A finite JSON number (Python's json module also accepts NaN and Infinity)."""
    if type(v) is float:  # most values: the same answer, sooner
        return math.isfinite(v)
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _finite_only(record: dict) -> dict:
    """The record without numeric fields that are not finite, at the top level and in "gpu"."""
    out = {k: v for k, v in record.items()
           if not isinstance(v, float) or math.isfinite(v)}
    if isinstance(out.get("gpu"), dict):
        out["gpu"] = _finite_only(out["gpu"])
    elif "gpu" in out:
        del out["gpu"]
    return out


def _read_header(path: Path, first_line: str) -> tuple[dict | None, str]:
    """The header and a note on fields it dropped, or None and why the file is not a profile
    this reader can use."""
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
    dropped = [k for k in _NUMERIC_HEADER if k in h and not _is_number(h[k])]
    for k in dropped:
        del h[k]
    gpu = h.get("gpu")
    if isinstance(gpu, dict):
        bad = [k for k in _NUMERIC_GPU if k in gpu and not _is_number(gpu[k])]
        for k in bad:
            del gpu[k]
        dropped += [f"gpu.{k}" for k in bad]
        for k in ("name", "reason"):
            if k in gpu:
                gpu[k] = str(gpu[k])
    elif gpu is not None:
        del h["gpu"]
        dropped.append("gpu")
    for k in ("host", "run_id", "dtrain_version", "job_id"):
        if k in h:
            h[k] = str(h[k])
    if "attempt" in h and not (_is_number(h["attempt"]) and h["attempt"] >= 0
                               and h["attempt"] == int(h["attempt"])):
        del h["attempt"]
        dropped.append("attempt")
    elif "attempt" in h:
        h["attempt"] = int(h["attempt"])
    return h, ("; ".join(f"header field {k} is not valid and was ignored" for k in dropped))


def _step_from(record: dict) -> tuple[Step | None, str]:
    """The step, or None and what is wrong with the record."""
    for k in _STEP_FIELDS:
        if not _is_number(record.get(k)):
            return None, f"a step record whose {k!r} is {_shown(record.get(k))}, not a number"
    if record["duration_ms"] < 0:
        return None, f"a step record with a negative duration_ms ({record['duration_ms']})"
    phases = record.get("phases_ms", {})
    if not isinstance(phases, dict):
        return None, "a step record whose 'phases_ms' is not an object"
    for k, v in phases.items():
        if not _is_number(v) or v < 0:
            return None, f"a step record whose phase {str(k)!r} is {_shown(v)} ms"
    phases = {str(k): float(v) for k, v in phases.items()}
    engine = record.get("engine")
    if engine is not None:
        engine = {str(k): float(v) for k, v in engine.items() if _is_number(v)} \
            if isinstance(engine, dict) else None
    other = record.get("other_ms", 0.0)
    samples = record.get("samples", 0)
    return Step(index=int(record["step"]), t=float(record["t"]),
                duration_ms=float(record["duration_ms"]), phases_ms=phases,
                other_ms=float(other) if _is_number(other) and other >= 0 else 0.0,
                samples=int(samples) if _is_number(samples) else 0, engine=engine), ""


def _shown(v) -> str:
    text = json.dumps(v) if v is not None else "missing"
    return text if len(text) <= 40 else text[:37] + "..."


def _read_bytes(path: Path, label: str, skipped: list[str], first_line: bool = False) -> \
        bytes | None:
    try:
        return read_regular(path, first_line=first_line)
    except NotRegular as e:
        skipped.append(not_regular_note(label, str(e)))
    except OSError as e:
        skipped.append(f"{label}: cannot be read ({e.strerror or e})")
    return None


def read_header(path: Path, skipped: list[str], label: str = "") -> dict | None:
    """A file's header alone, read from its first line; None (with the reason in `skipped`, as
    read_rank_file words it) when the file is no profile this report reads."""
    label = label or path.name
    data = _read_bytes(path, label, skipped, first_line=True)
    if data is None:
        return None
    first = data.decode("utf-8", errors="replace")
    if not first.strip():  # blank first line: empty, or not a profile; the whole file tells
        data = _read_bytes(path, label, skipped)
        if data is None:
            return None
        if not data.decode("utf-8", errors="replace").strip():
            skipped.append(f"{label}: empty (the profiler was started but wrote nothing)")
            return None
    header, why = _read_header(path, first.split("\n")[0])
    if header is None:
        skipped.append(f"{label}: {why}")
    return header


def read_rank_file(path: Path, skipped: list[str], label: str = "") -> RankProfile | None:
    """One rank's file; None (with the reason in `skipped`) when it is not usable at all. Messages
    name the file by `label` (default: its name)."""
    label = label or path.name
    data = _read_bytes(path, label, skipped)
    if data is None:
        return None
    text = data.decode("utf-8", errors="replace")
    if not text.strip():
        skipped.append(f"{label}: empty (the profiler was started but wrote nothing)")
        return None
    lines = text.split("\n")
    truncated_tail = lines[-1] != ""  # the last line has no newline: cut short mid-line
    if not truncated_tail:
        lines.pop()
    header, why = _read_header(path, lines[0])
    if header is None:
        skipped.append(f"{label}: {why}")
        return None
    if why:
        skipped.append(f"{label}: {why}")
    profile = RankProfile(path=path, header=header, label=label)
    bad: list[tuple[int, str]] = []  # (line number, what is wrong with it)
    unknown = 0
    for number, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue  # padding that keeps writes within a page (Note [Complete lines only])
        last = number == len(lines)
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as e:
            if last and truncated_tail:
                skipped.append(f"{label}: its last line (line {number}) is cut short, as when "
                               f"a process dies while writing; the line was left out")
            else:
                bad.append((number, f"not JSON ({e.msg if hasattr(e, 'msg') else e})"))
            continue
        if not isinstance(record, dict):
            bad.append((number, "not a JSON object"))
            continue
        kind = record.get("type")
        t = record.get("t")
        if kind in ("sample", "start", "stop", "end") and not _is_number(t):
            bad.append((number, f"a {kind} record whose 't' is {_shown(t)}, not a number"))
            continue
        if kind == "step":
            step, wrong = _step_from(record)
            if step is None:
                bad.append((number, wrong))
                continue
            profile.steps.append(step)
            profile.last_t = max(profile.last_t, step.t + step.duration_ms / 1e3)
        elif kind == "sample":
            profile.samples.append(_finite_only(record))
            profile.last_t = max(profile.last_t, t)
        elif kind in ("start", "stop", "end"):
            profile.last_t = max(profile.last_t, t)
            if kind == "start":
                n = record.get("step", 0)
                profile.start_steps.append(int(n) if _is_number(n) else 0)
            elif kind == "stop":
                n = record.get("phases_outside_steps", 0)
                profile.phases_outside_steps += int(n) if _is_number(n) else 0
            else:
                profile.closed = True
        elif kind == "header":
            bad.append((number, "a second header"))
        else:
            unknown += 1
    if bad:
        shown = "; ".join(f"line {n}: {why}" for n, why in bad[:3])
        more = f"; and {len(bad) - 3} more (lines {number_ranges(n for n, _ in bad[3:])})" \
            if len(bad) > 3 else ""
        skipped.append(f"{label}: {len(bad)} line(s) that are not valid profile records "
                       f"were left out ({shown}{more})")
    if unknown:
        skipped.append(f"{label}: {unknown} record(s) of a type this report does not know "
                       f"were ignored")
    profile.steps.sort(key=lambda s: s.index)
    profile.samples.sort(key=lambda s: s["t"])
    if not profile.closed:
        last_step = profile.steps[-1].index if profile.steps else None
        skipped.append(f"{label}: rank {profile.rank}'s profile has no end record: the process "
                       f"stopped without closing its profile (crashed or killed?)"
                       + (f"; its last recorded step is {last_step}" if last_step is not None
                          else "; it recorded no step"))
    return profile


def _fail(message: str):
    raise ProfileError(message)


def _headers(paths: list[Path], notes: dict[str, list[str]]) -> list[tuple[ProfileFile, dict]]:
    """Every file with a usable header; the others' reasons in `notes`, by file."""
    out = []
    for f in find_files(paths, notes, _fail):
        why: list[str] = []
        header = read_header(f.path, why, f.label)
        if header is None:
            notes.setdefault(f.label, []).extend(why)
        else:
            out.append((f, header))
    return out


def list_runs(paths: list[Path]) -> list[RunFiles]:
    """The runs in the folders (and files) given, oldest first, read from their headers only."""
    runs = group_runs(_headers(paths, {}))
    if not runs:
        raise ProfileError("no readable profile in " + ", ".join(str(p) for p in paths))
    return runs


def load_run(paths: list[Path], run: str | None = None, attempt: int | None = None) -> Run:
    """All ranks of one run: the newest when the files hold several, or the one `run` (a run id,
    a job id or a run's folder) and `attempt` name. The other runs are listed, not read."""
    notes: dict[str, list[str]] = {}  # by file, so that they come out in the files' order
    headers = _headers(paths, notes)
    source = ", ".join(str(p) for p in paths)
    if not headers:
        raise ProfileError("nothing to report from " + source + ": "
                           + "; ".join([n for ns in notes.values() for n in ns]
                                       or ["no readable profile"]))
    runs = group_runs(headers)
    chosen, how = choose_run(runs, run, attempt, _fail)
    # The records are millions of small objects without cycles: the garbage collector's passes
    # over them as they pile up would cost a third of the reading and find nothing.
    collecting = gc.isenabled()
    gc.disable()
    try:
        profiles = []
        for f, _ in chosen.files:
            profile = read_rank_file(f.path, notes.setdefault(f.label, []), f.label)
            if profile:
                profiles.append(profile)
    finally:
        if collecting:
            gc.enable()
    skipped = [n for ns in notes.values() for n in ns]
    if not profiles:
        raise ProfileError("nothing to report from " + source + ": "
                           + "; ".join(skipped or ["no readable profile"]))
    ranks: dict[int, RankProfile] = {}
    for p in sorted(profiles, key=lambda p: str(p.path)):
        if p.rank in ranks:
            skipped.append(f"{p.name}: a second file for rank {p.rank} "
                           f"(after {ranks[p.rank].name}); not merged")
            continue
        ranks[p.rank] = p
    size = max(p.size for p in ranks.values())
    for p in ranks.values():
        if p.size != size:
            skipped.append(f"{p.name}: says the run had {p.size} ranks, others say {size}")
    missing = [r for r in range(size) if r not in ranks] if size - len(ranks) < 100000 else \
        []
    if size > len(ranks):
        shown = number_ranges(missing) if missing else f"{size - len(ranks)} ranks"
        skipped.append(f"no profile for rank(s) {shown} of {size}: the "
                       f"report covers the other ranks only")
    return Run(ranks=ranks, size=size, run_id=chosen.run_id, source=source, skipped=skipped,
               job_id=chosen.job_id, attempt=chosen.attempt,
               other_runs=[r for r in runs if r is not chosen], chosen=how)
