"""Attempt journals: what a pool's processes make durable so that a pool killed at any moment
neither burns the attempts it claimed ahead nor loses the outcomes it has not written yet.

A pool claims jobs ahead of its processes (each claim counts an attempt: the attempt number is
the fencing token) and writes its processes' outcomes in batches. If it is SIGKILLed, whoever
reconciles its jobs asks the journal what became of each attempt (its *fate*):

- ``claimed`` only: its function never started. The attempt is given back
  (:func:`outlast.machine.give_back`), so ``attempts`` counts starts.
- ``started``: the function ran and was cut off: an abandoned attempt, as without a journal.
- ``returned``: the function returned and its outcome was journaled before the pool could
  write it: the outcome is written now (fenced by the attempt), and the function is not run
  again.
- nothing: counted as started (what every claimer other than a pool gets).

A waiter on a canceled job also asks it: while the live pool's journal says the attempt
started and has not returned, the job's code still runs (``outlast.store.follower``).

On the local stores a journal is a small append-only file per writer process
(``journal/<worker>+<token>+<label>`` beside the store), one line per record; a record is
written with one ``write()`` before the event it records happens, and survives the process
(not the machine: after a power cut an attempt may be counted or run once more, as without a
journal). A reader ignores a torn last line. The file is compacted when it passes
:data:`LIMIT`, keeping only what was not acknowledged yet. On PostgreSQL, where the reconciler
may be on another machine, the latest record of each job is a row of the table ``journal``:
claims are written in the claim's transaction, starts and outcomes by one statement each on
the process's own connection, committed without waiting for the disk flush (a server crash
may take back the last moments' records: those attempts then count, or run once more, as
without a journal). A thorough sweep forgets the rows of jobs no worker holds. That is two
short statements per job beside the pool's batched writes: the price, measured in
BENCHMARKS.md, of never burning an attempt.

The journal is complete when a job is reconciled: a pool's job processes keep its jobs alive
after the pool dies, until they are dead too (the local stores' liveness lock is inherited;
on PostgreSQL a job process holds an advisory lock of the job while it runs it).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from outlast.errors import CorruptJob
from outlast.machine import Outcome
from outlast.paths import worker_file_name
from outlast.store.common import log

#: A journal file is rewritten with only what still matters once it grows past this.
LIMIT = 64 * 1024
#: The fate of an attempt whose worker died after claiming it and before starting it.
NOT_STARTED = "not started"
#: The fate of an attempt whose function was called and has not returned (or was cut off).
STARTED = "started"
#: What became of an attempt: None (nothing known), NOT_STARTED, STARTED, or its outcome.
Fate = Outcome | str | None
Key = tuple[str, int]  # (job id, attempt)

_RANK = {b"c": 1, b"s": 2, b"o": 3}


class Journal:
    """The journal of a store that keeps none: every claimed attempt counts, and outcomes are
    written only by the pool. Adapters override all of it or nothing."""

    def claimed(self, keys: Sequence[Key], started: bool = False) -> None:
        """A pool claimed these attempts; none has started (``started``: all start at once,
        as an async pool's do, so they are recorded as started)."""

    def started(self, key: Key) -> bool:
        """The attempt's function is about to be called: False when that could not be
        recorded (a full disk, the server gone), so that it is not called."""
        return True

    def returned(self, key: Key, outcome: Outcome) -> None:
        """The attempt ended with ``outcome``, which its pool is about to write."""

    def send_returned(self, key: Key, outcome: Outcome) -> None:
        """:meth:`returned`, perhaps still on its way when this returns: the record is in
        once :meth:`settle` returns (a journal on a server sends it and lets the caller hand
        the outcome to its pool meanwhile). A record that cannot be written is logged."""
        self.returned(key, outcome)

    def settle(self) -> None:
        """Wait until what :meth:`send_returned` sent is written (or has failed)."""

    def written(self, keys: Iterable[Key]) -> None:
        """These attempts' outcomes are in the store: their records may be forgotten."""

    def discard(self) -> None:
        """Remove the journal (its writer ended, with everything written)."""

    def close(self) -> None:
        """Let go of what the journal holds open (a file, a connection) as its writer ends,
        whether it was discarded or keeps records for whoever reconciles its jobs."""


def journal_name(worker: str, label: str) -> str:
    return f"{worker_file_name(worker)}+{label}"


class FileJournal(Journal):
    """One writer's journal file (see the module docstring). Writes that fail (a full disk)
    are logged once and skipped: the attempt is then counted as without a journal."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None
        self._size = 0
        self._warned = False
        # what a compaction keeps: claims not started, starts not returned, outcomes unwritten
        self._keep: dict[Key, bytes] = {}

    def claimed(self, keys: Sequence[Key], started: bool = False) -> None:
        lines = []
        for key in keys:
            line = record_line("s" if started else "c", key).encode()
            self._keep[key] = line
            lines.append(line)
        if lines:
            self._append(b"".join(lines))

    def started(self, key: Key) -> bool:
        self._keep[key] = line = record_line("s", key).encode()
        return self._append(line)

    def returned(self, key: Key, outcome: Outcome) -> None:
        if outcome.verb != "gone":
            self._keep[key] = line = record_line("o", key, outcome).encode()
            self._append(line)

    def written(self, keys: Iterable[Key]) -> None:
        for key in keys:
            self._keep.pop(key, None)

    def discard(self) -> None:
        self.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _append(self, data: bytes) -> bool:
        try:
            if self._size + len(data) > LIMIT and self._size:
                self._compact()
            if self._fd is None:
                flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
                self._fd = os.open(self.path, flags, 0o600)
                self._size = os.fstat(self._fd).st_size
            _write_all(self._fd, data)
            self._size += len(data)
        except OSError as exc:
            if not self._warned:
                self._warned = True
                log.warning("cannot write the attempt journal %s: %s", self.path, exc)
            return False
        return True

    def _compact(self) -> None:
        """Rewrite the file with what is still kept (a new file renamed over the old one, so
        a kill during the rewrite leaves one or the other whole)."""
        tmp = self.path.with_name(self.path.name + ".tmp")
        data = b"".join(self._keep.values())
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            _write_all(fd, data)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._size = len(data)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def record_line(kind: str, key: Key, outcome: Outcome | None = None) -> str:
    """One journal record: ``c|s|o JOB_ID ATTEMPT [OUTCOME-JSON]`` and a newline."""
    tail = "" if outcome is None else " " + json.dumps(outcome.to_dict(), separators=(",", ":"))
    return f"{kind} {key[0]} {key[1]}{tail}\n"


def parse_line(line: bytes) -> tuple[Key, int, bytes] | None:
    """``(key, rank, outcome JSON)`` of a record line (without its newline), or None."""
    parts = line.split(b" ", 3)
    rank = _RANK.get(parts[0], 0)
    if rank == 0 or len(parts) < 3 or not parts[2].isdigit():
        return None
    key = (parts[1].decode(errors="replace"), int(parts[2]))
    return key, rank, parts[3] if len(parts) > 3 else b""


def line_fate(line: str | None, key: Key) -> Fate:
    """The fate of attempt ``key`` by one record (PostgreSQL's column): None unless the
    record is that attempt's."""
    parsed = parse_line(line.rstrip("\n").encode()) if line else None
    if parsed is None or parsed[0] != key:
        return None
    return fate_of(key, parsed[1], parsed[2])


def read_fates(directory: Path, worker: str) -> dict[Key, Fate]:
    """The fate of every attempt journaled by ``worker``'s processes (in all their files)."""
    prefix = worker_file_name(worker) + "+"
    best: dict[Key, tuple[int, bytes]] = {}
    try:
        entries = [e.path for e in os.scandir(directory) if e.name.startswith(prefix)]
    except FileNotFoundError:
        return {}
    for path in entries:
        if path.endswith(".tmp"):
            continue
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            continue
        for line in data.split(b"\n")[:-1]:  # the last piece is empty, or a torn record
            parsed = parse_line(line)
            if parsed is not None and parsed[1] > best.get(parsed[0], (0, b""))[0]:
                best[parsed[0]] = parsed[1:]
    return {key: fate_of(key, rank, tail) for key, (rank, tail) in best.items()}


def fate_of(key: Key, rank: int, tail: bytes) -> Fate:
    if rank == 1:
        return NOT_STARTED
    if rank == 2:
        return STARTED
    if rank == 3:
        try:
            return Outcome.from_dict(json.loads(tail))
        except (ValueError, KeyError, TypeError, CorruptJob) as exc:
            log.warning("job %s attempt %s: unreadable journaled outcome: %s", key[0], key[1], exc)
    return None
