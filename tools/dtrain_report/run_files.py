"""Finding a profile's files, and choosing the run to report when a folder holds several.

dtrain writes each run into a folder of its own inside the profile folder (Note [Profile layout]
in include/dtrain/profile/run_folder.hpp): <folder>/<run-id>/rank-<r>.jsonl, or under dtrainrun
<folder>/<job-id>/attempt-<n>/rank-<r>.jsonl; older dtrains wrote rank-<r>.jsonl into the folder
itself. The files are found at each of those depths, grouped by the run id in their headers
(never by folder: files may have been moved), and one run is chosen: the newest, or the one the
command line names. Only regular files are opened: a FIFO or a device named like a profile
would block a read forever, so it is skipped with a note.
"""

from __future__ import annotations

import datetime
import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

# Below a folder given on the command line: its own files, its runs' folders, and a job's attempts.
_PATTERNS = ("*.jsonl", "*/*.jsonl", "*/*/*.jsonl")
_TAIL_BYTES = 16384  # enough for the last lines of a file: its end record and last step


class NotRegular(OSError):
    """A path that is not a regular file (a FIFO, a device, a socket, a folder)."""


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISDIR, "a folder")):
        if test(mode):
            return name
    return "not a regular file"


def read_regular(path: Path, first_line: bool = False, tail: int = 0) -> bytes:
    """The file's bytes (or only its first line, or only its last `tail` bytes). Opened without
    blocking and checked before reading, so a FIFO that takes the name after a listing cannot
    hang the report either. Raises NotRegular or OSError."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegular(_kind(st.st_mode))
        with os.fdopen(fd, "rb", closefd=True) as f:
            fd = -1
            if tail:
                f.seek(max(0, st.st_size - tail))
                return f.read()
            if first_line:
                return f.readline()
            return f.read()
    finally:
        if fd >= 0:
            os.close(fd)


def not_regular_note(label: str, why: str) -> str:
    return (f"{label}: {why}, not a regular file; skipped (reading it could wait forever); a "
            f"profile is a regular file that dtrain wrote")


@dataclass
class ProfileFile:
    path: Path
    label: str  # how messages name it: its path relative to the folder given


def find_files(paths: list[Path], notes: dict[str, list[str]], error) -> list[ProfileFile]:
    """The candidate files under each folder (and the files named), in a stable order; non-regular
    ones are left out with a note. `error(message)` raises: nothing to read."""
    files: list[ProfileFile] = []
    for p in paths:
        try:
            mode = p.stat().st_mode
        except OSError:
            error(f"'{p}' does not exist: name the folder given to DTRAIN_PROFILE, or profile "
                  f"files in it")
        if stat.S_ISDIR(mode):
            found = sorted({f for pattern in _PATTERNS for f in p.glob(pattern)},
                           key=lambda f: (len(f.relative_to(p).parts), str(f)))
            if not found:
                error(f"no profile files (*.jsonl) in '{p}': run the training with "
                      f"DTRAIN_PROFILE={p} (or ProfilerOptions::dir) so that every rank writes "
                      f"rank-<r>.jsonl there, in a folder per run")
            files.extend(ProfileFile(f, str(f.relative_to(p))) for f in found)
        else:
            files.append(ProfileFile(p, p.name))
    out = []
    for f in files:
        notes.setdefault(f.label, [])  # notes come out in the files' order
        try:
            mode = f.path.stat().st_mode
        except OSError as e:
            notes.setdefault(f.label, []).append(
                f"{f.label}: cannot be read ({e.strerror or e})")
            continue
        if not stat.S_ISREG(mode):
            notes.setdefault(f.label, []).append(not_regular_note(f.label, _kind(mode)))
            continue
        out.append(f)
    return out


@dataclass
class RunFiles:
    """One run's files, known from their headers only."""
    run_id: str
    files: list[tuple[ProfileFile, dict]] = field(default_factory=list)

    def _first(self, key):
        return next((h[key] for _, h in self.files if key in h), None)

    @property
    def job_id(self) -> str | None:
        return self._first("job_id")

    @property
    def attempt(self) -> int | None:
        return self._first("attempt")

    @property
    def started(self) -> float:
        return max(float(h.get("start_unix_ms", 0)) for _, h in self.files)

    @property
    def folder(self) -> str:
        """The folder its files are in, relative to the folder given ("." when in it)."""
        parents = {str(Path(f.label).parent) for f, _ in self.files}
        return parents.pop() if len(parents) == 1 else ", ".join(sorted(parents))

    def title(self) -> str:
        """'<run-id> (job J, attempt N)', or the run id alone outside dtrainrun."""
        if self.job_id is None:
            return self.run_id or "?"
        attempt = f", attempt {self.attempt}" if self.attempt is not None else ""
        return f"{self.run_id or '?'} (job {self.job_id}{attempt})"

    def describe(self) -> str:
        """The title with what its files show without reading them whole: ranks, where, when,
        and whether they ended cleanly (from their last lines)."""
        ranks = {h["rank"] for _, h in self.files}
        size = max(h["size"] for _, h in self.files)
        ended, last_steps = 0, []
        for f, _ in self.files:
            closed, last_step = _tail_facts(f.path)
            ended += closed
            if last_step is not None:
                last_steps.append(last_step)
        where = "in the folder given" if self.folder == "." else f"in {self.folder}"
        parts = [f"{len(ranks)} of {size} rank(s)", where]
        when = _utc(self.started)
        if when:
            parts.append(f"started {when}")
        if ended < len(self.files):
            parts.append("did not end cleanly" + (f", last step {max(last_steps)}"
                                                   if last_steps else ""))
        return f"{self.title()}: " + ", ".join(parts)


def _utc(unix_ms: float) -> str:
    try:
        return datetime.datetime.fromtimestamp(unix_ms / 1e3, datetime.timezone.utc) \
            .strftime("%Y-%m-%d %H:%M:%S UTC") if unix_ms > 0 else ""
    except (ValueError, OverflowError, OSError):
        return ""


def _tail_facts(path: Path) -> tuple[bool, int | None]:
    """(whether the file ends with an end record, the last step index in its last lines)."""
    try:
        data = read_regular(path, tail=_TAIL_BYTES)
    except OSError:
        return False, None
    closed, last_step = False, None
    for line in reversed(data.decode("utf-8", errors="replace").split("\n")[1:]):
        try:
            record = json.loads(line) if line.strip() else None
        except (json.JSONDecodeError, RecursionError):
            continue
        if not isinstance(record, dict):
            continue
        if record.get("type") == "end" and last_step is None:
            closed = True
        if record.get("type") == "step" and isinstance(record.get("step"), int):
            last_step = record["step"]
            break
    return closed, last_step


def group_runs(files: list[tuple[ProfileFile, dict]]) -> list[RunFiles]:
    """The runs, oldest first: by the latest start_unix_ms of their files, and of runs that
    started together the one found first counts as the newer."""
    runs: dict[str, RunFiles] = {}
    for f, header in files:
        run_id = str(header.get("run_id", ""))
        runs.setdefault(run_id, RunFiles(run_id)).files.append((f, header))
    found = list(runs.values())
    return [r for _, r in sorted(enumerate(found), key=lambda ir: (ir[1].started, -ir[0]))]


def choose_run(runs: list[RunFiles], name: str | None, attempt: int | None,
               error) -> tuple[RunFiles, str]:
    """The run to report and why it was chosen: the newest; the run, job or folder `name` names
    (a job: its newest attempt); attempt `attempt` of that job or of the newest run's job."""
    newest = runs[-1]
    listing = "; ".join(r.title() + f" in {r.folder}" for r in reversed(runs[-8:]))
    if name is None and attempt is None:
        return newest, "the newest"
    if name is not None:
        wanted = name.strip().rstrip("/") or name
        picked = [r for r in runs if r.run_id == wanted] or \
            [r for r in runs if r.job_id == wanted] or \
            [r for r in runs if r.folder == wanted or r.folder.endswith("/" + wanted)]
        if not picked:
            error(f"no run '{name}' among the {len(runs)} run(s) found (newest first: {listing}"
                  f"{' ...' if len(runs) > 8 else ''}): give --run a run id, a job id or a run's "
                  f"folder, as --list-runs shows them")
        how = f"chosen with --run {name}"
    else:
        picked = [r for r in runs if r.job_id is not None and r.job_id == newest.job_id]
        if newest.job_id is None:
            error(f"--attempt {attempt}: the newest run, {newest.title()}, was not started by "
                  f"dtrainrun and has no attempts; name a job with --run JOB_ID (--list-runs "
                  f"shows them)")
        how = f"attempt {attempt} of the newest run's job"
    if attempt is not None:
        jobs = {r.job_id for r in picked if r.job_id is not None}
        if not jobs:
            error(f"--attempt {attempt}: run {picked[-1].title()} was not started by dtrainrun "
                  f"and has no attempts; name a job with --run JOB_ID (--list-runs shows them)")
        of_job = [r for r in runs if r.job_id in jobs]
        chosen = [r for r in of_job if r.attempt == attempt]
        if not chosen:
            have = sorted({r.attempt for r in of_job if r.attempt is not None})
            error(f"no attempt {attempt} of job {', '.join(sorted(jobs)) or '?'}: it has "
                  f"attempt(s) {', '.join(map(str, have)) or 'none'} here (--list-runs shows "
                  f"them)")
        picked = chosen
        if name is not None:
            how = f"chosen with --run {name} --attempt {attempt}"
    return picked[-1], how
