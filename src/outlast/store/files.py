"""The files adapter: one JSON file per job, the transparent option (the Go seed's design).

Layout of the store folder (0700; every file 0600)::

    <id>.json           the job document, exactly ``JobState.to_dict()``
    <id>.events.jsonl   its events, one ``ProgressEvent.to_dict()`` per line, seq 1, 2, 3…
    <id>.retries        the ids of the jobs that retry it, one a line (``outlast retry``)
    <id>.lock           short flock taken (blocking) for every read-modify-write of the job
    <id>.worker.lock    the lifetime worker lock (:mod:`outlast.store.locks`)
    .outlast/locks/     the liveness lock of each worker process (``host:pid``)
    .outlast/pulse/     pulse files that wake waiters (:mod:`outlast.store.notify`)
    .outlast/logs/      the jobs' output
    .outlast/schedules/ one ``<name>.json`` per schedule (``Schedule.to_dict()``), and its
                        ``<name>.lock`` for read-modify-write

Durability: a document is written to ``<id>.json.<random>.tmp``, fsynced, renamed over
``<id>.json`` and the folder is fsynced, so a reader sees the old or the new document, never a
part of one, and a transition that returned survives a crash or power loss. Events are appended
(one ``write``, then fsync) *before* the state is replaced: a watcher that reads a terminal state
and then the events finds the terminal event. A crash between the two leaves events whose state
change is lost (reconcile then records what happened). A torn last event line (a crash inside the
append) is ignored by readers and cut off by the next writer, so seq numbers never gap. Stale
``*.tmp`` files of a crashed write are never read as jobs.

Limits: ``list`` and ``claim`` scan the folder, O(n) in the number of jobs (a per-process index
keyed by inode, size and mtime keeps that to one ``stat`` per unchanged document, about 10 ms per
1,000 jobs); ``get`` and every transition touch only the job's own files. flock wants a local
filesystem: one machine only.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

from outlast import codec, machine
from outlast.errors import (
    CorruptJob,
    InvalidJobId,
    JobActive,
    JobNotFound,
    ScheduleNotFound,
    StoreError,
)
from outlast.ids import DEDICATED, check_id
from outlast.model import JobState, Kind, ProgressEvent, Schedule, Status, parse_time, utcnow
from outlast.paths import worker_file_name
from outlast.store import _local
from outlast.store.base import (
    REMOVE,
    Applied,
    ChangeWatch,
    ScheduleChange,
    Transition,
    fire_one,
    live,
)
from outlast.store.common import disk_full, log, make_private_dir, translated
from outlast.store.journal import Journal
from outlast.store.query import Filter
from outlast.store.stats import Stats
from outlast.store.stats import from_states as stats_from_states

#: ``<x>.worker``'s short lock would be ``<x>``'s worker lock, so no job here has that name.
_RESERVED = ".worker"
#: A file changed this recently may share inode, size and mtime with a later version (inodes
#: are reused and mtime is coarse), so the scan cache only trusts older files ("racy git").
_RACY_NS = 2_000_000_000
_TAIL_CHUNK = 4096
_MAX_MARKS = 4096


@dataclass(frozen=True, slots=True)
class _Entry:
    """What a scan keeps of one document: an index for filtering and ordering, never returned
    (``list`` and ``claim`` read the documents they pick afresh)."""

    #: ``(inode, size, mtime_ns)`` when read, and whether that may identify this version.
    key: tuple[int, int, int]
    trusted: bool
    digest: int
    id: str
    created_at: datetime
    status: Status
    worker: str | None
    run_after: datetime | None
    queue: str
    kind: Kind
    labels: dict[str, str]
    finished_at: datetime | None = None
    keep: float | None = None
    priority: int = 0
    retry_of: str | None = None
    unique_key: str | None = None
    limit_key: str | None = None
    limit: int | None = None
    name: str = ""
    started_at: datetime | None = None


def _index(job_id: str, d: Any, key: tuple[int, int, int], trusted: bool, digest: int) -> _Entry:
    """The indexed fields of a parsed document (a full parse costs four times as much)."""
    created_at, run_after = parse_time(d["created_at"], ""), parse_time(d["run_after"], "")
    if d["id"] != job_id or created_at is None:
        raise ValueError("not indexable")
    fields = (Status(d["status"]), d["worker"], run_after, d["queue"], Kind(d["kind"]))
    finished_at, keep = parse_time(d.get("finished_at"), ""), d.get("keep")
    priority = d.get("priority", 0)
    if (keep is not None and not isinstance(keep, int | float)) or not isinstance(priority, int):
        raise ValueError("not indexable")
    retry_of, unique_key = d.get("retry_of"), d.get("unique_key")
    limit_key, limit = d.get("limit_key"), d.get("limit")
    if not all(v is None or isinstance(v, str) for v in (retry_of, unique_key, limit_key)):
        raise ValueError("not indexable")
    if limit is not None and not isinstance(limit, int):
        raise ValueError("not indexable")
    name, started_at = d["name"], parse_time(d.get("started_at"), "")
    if not isinstance(name, str):
        raise ValueError("not indexable")
    return _Entry(
        key,
        trusted,
        digest,
        job_id,
        created_at,
        *fields,
        dict(d["labels"]),
        finished_at,
        keep,
        priority,
        retry_of,
        unique_key,
        limit_key,
        limit,
        name,
        started_at,
    )


_LIVE = (Status.RUNNING, Status.PENDING)
_HOLDING = (Status.PENDING, Status.RUNNING, Status.PAUSED)  # a live job holds its unique key


def _claimable(e: _Entry, queues: list[str] | None, kinds: list[Kind] | None) -> bool:
    return (
        e.status == Status.PENDING
        and e.worker is None
        and (not queues or e.queue in queues)
        and (not kinds or e.kind in kinds)
    )


def _is_job_id(job_id: str) -> bool:
    """Whether ``<job_id>.json`` can be a document of this store (not tmp files or junk)."""
    try:
        check_id(job_id)
    except InvalidJobId:
        return False
    return not job_id.endswith(_RESERVED)


def _stat_key(st: os.stat_result) -> tuple[int, int, int]:
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _slurp(path: Path) -> tuple[os.stat_result, bytes]:
    with open(path, "rb", buffering=0) as f:  # O_CLOEXEC, as every open() in Python
        return os.fstat(f.fileno()), f.readall()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class FilesStore(_local.LocalStore):
    """A store folder of plain files; see the module docstring for the layout and promises."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path).absolute()
        self.url = f"files://{self.path}"
        make_private_dir(self.path)
        self.parts = _local.LocalParts(
            self.path / ".outlast", lock_dir=self.path, lock_suffix=".worker.lock"
        )
        self._scanned: dict[str, _Entry] = {}
        self._marks: dict[str, tuple[int, int, int]] = {}  # id -> (inode, seq, end offset)
        self._schedules_made = False
        self._next_fire_at: tuple[int, datetime | None] | None = None
        self._schedule_cache: dict[str, tuple[tuple[int, int, int], Schedule]] = {}

    # ------------------------------------------------------------------ paths, files, locks
    def _file(self, job_id: str, suffix: str) -> Path:
        return self.path / f"{check_id(job_id)}{suffix}"

    def _translated(self, what: str) -> contextlib.AbstractContextManager[None]:
        """Turn OS failures into :class:`StoreError` at the boundary."""
        return translated(
            f"files store {self.path}",
            what,
            hint=lambda exc: (
                "no space left on its disk"
                if getattr(exc, "errno", 0) == 28 or disk_full(self.path)
                else None
            ),
        )

    @contextlib.contextmanager
    def _locked(self, job_id: str) -> Iterator[None]:
        """Hold ``<id>.lock`` exclusively. The lock file lives only as long as the document:
        it is unlinked, still held, when no document is left (delete, a missing job), so a
        waiter that then gets the old inode sees it is no longer the path's and retries."""
        if job_id.endswith(_RESERVED):
            raise JobNotFound(f"no job {job_id}")
        path = self._file(job_id, ".lock")
        for _ in range(1000):
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                with contextlib.suppress(FileNotFoundError):
                    if os.fstat(fd).st_ino == os.stat(path).st_ino:
                        break
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)
        else:
            raise StoreError(f"files store: the lock of job {job_id} keeps being replaced")
        try:
            yield
        finally:
            try:
                if not os.path.exists(self._file(job_id, ".json")):
                    with contextlib.suppress(OSError):
                        os.unlink(path)
            finally:
                os.close(fd)

    def _sync_dir(self, folder: Path | None = None) -> None:
        """Make renames and unlinks in the folder (the store's, by default) durable."""
        fd = os.open(folder or self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def close(self) -> None:
        self.parts.close()

    # ------------------------------------------------------------------ documents
    def _load(self, job_id: str) -> JobState:
        try:
            _, raw = _slurp(self._file(job_id, ".json"))
        except FileNotFoundError:
            raise JobNotFound(f"no job {job_id}") from None
        return codec.decode(job_id, raw)

    def _write_state(self, state: JobState) -> None:
        """Replace the document atomically and durably (temp file, fsync, rename, dir fsync)."""
        self._replace(self._file(state.id, ".json"), codec.encode(state) + b"\n")

    def _replace(self, final: Path, data: bytes) -> None:
        """Replace ``final`` with ``data`` atomically and durably."""
        tmp = final.with_name(f"{final.name}.{os.urandom(6).hex()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            try:
                _write_all(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, final)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        self._sync_dir(final.parent)

    def _insert(self, state: JobState) -> JobState | None:
        if state.id.endswith(_RESERVED):
            raise InvalidJobId(f"job ids ending in {_RESERVED!r} are reserved by the files store")
        if state.unique_key is not None:
            with self._translated(f"create {state.id}"), self._key_locked(state.unique_key):
                holder = self._holder(state.unique_key)
                if holder is not None:
                    return holder
                self._write_new(state)
        else:
            with self._translated(f"create {state.id}"):
                self._write_new(state)
        self.parts.pulse_pools()
        return None

    def _write_new(self, state: JobState) -> None:
        with self._locked(state.id):
            if self._file(state.id, ".json").exists():
                raise StoreError(f"files store: job {state.id} already exists")
            # Events left by a delete that crashed half-way must not join the new job's log.
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._file(state.id, ".events.jsonl"))
            self._write_state(state)
        if state.retry_of is not None:  # the old job's list of its retries (one append)
            fd = os.open(
                self._file(state.retry_of, ".retries"),
                os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC,
                0o600,
            )
            try:
                _write_all(fd, f"{state.id}\n".encode())
            finally:
                os.close(fd)

    @contextlib.contextmanager
    def _key_locked(self, key: str) -> Iterator[None]:
        """Hold the lock of a unique key (a file named by its hash) while checking that no
        live job holds it and creating the one that will."""
        import hashlib

        folder = make_private_dir(self.path / ".outlast" / "unique")
        name = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:40]
        fd = os.open(folder / f"{name}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _holder(self, key: str) -> JobState | None:
        """The live job that holds ``key`` (a scan: O(n) in the jobs, see the limits)."""
        for entry in self._scan():
            if entry.unique_key == key and entry.status in _HOLDING:
                try:
                    state = self._load(entry.id)
                except (JobNotFound, CorruptJob):
                    continue
                if state.unique_key == key and state.status in _HOLDING:
                    return state
        return None

    def _retries_of(self, job_id: str) -> list[str]:
        """From ``<id>.retries``, the ids of its retries as they were made (those since
        deleted left out)."""
        with self._translated(f"retries of {job_id}"):
            try:
                _, raw = _slurp(self._file(job_id, ".retries"))
            except FileNotFoundError:
                return []
            ids = [i for i in raw.decode("utf-8", "replace").split() if _is_job_id(i)]
            return [i for i in ids if self._file(i, ".json").exists()]

    def _read(self, job_id: str) -> JobState:
        with self._translated(f"read {job_id}"):
            return self._load(job_id)

    # ------------------------------------------------------------------ events
    def _tail(self, job_id: str, fd: int) -> tuple[int, int]:
        """``(seq of the last complete line, offset just after it)``, reading backwards."""
        pos = os.fstat(fd).st_size
        buf = b""
        while True:
            nl = buf.rfind(b"\n")
            if nl >= 0:
                start = buf.rfind(b"\n", 0, nl)
                if start >= 0 or pos == 0:
                    break
            elif pos == 0:
                return 0, 0  # empty, or nothing but a torn line
            step = min(pos, max(_TAIL_CHUNK, len(buf)))
            pos -= step
            buf = os.pread(fd, step, pos) + buf
        try:
            seq = json.loads(buf[start + 1 : nl])["seq"]
        except (ValueError, TypeError, KeyError) as exc:
            raise CorruptJob(f"job {job_id} has a corrupt event log: {exc!r}") from exc
        if not isinstance(seq, int) or isinstance(seq, bool) or seq < 1:
            raise CorruptJob(f"job {job_id} has a corrupt event log: seq {seq!r}")
        return seq, pos + nl + 1

    def _append(self, job_id: str, events: list[machine.NewEvent]) -> list[ProgressEvent]:
        """Append ``events`` after the last seq (job lock held): one write, then fsync."""
        path = self._file(job_id, ".events.jsonl")
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            seq, end = self._tail(job_id, fd)
            if end < os.fstat(fd).st_size:
                os.ftruncate(fd, end)  # a torn line from a crash inside an append
            stored = machine.number(job_id, seq, events, utcnow())
            data, written = b"".join(codec.encode_event(e) + b"\n" for e in stored), 0
            try:
                while written < len(data):
                    written += os.write(fd, data[written:])
            except BaseException:
                # Drop a torn line; keep whole ones, which a reader may have seen already.
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, end + data.rfind(b"\n", 0, written) + 1)
                raise
            os.fsync(fd)
            return stored
        finally:
            os.close(fd)

    def _events(self, job_id: str, after: int, limit: int | None) -> list[ProgressEvent]:
        # Lines only grow at the end and line k holds seq k, so a mark (inode, seq, offset)
        # left by an earlier read lets a watcher read just the new bytes.
        ino, seq, offset = self._marks.get(job_id, (0, 0, 0))
        with self._translated(f"events of {job_id}"):
            try:
                with open(self._file(job_id, ".events.jsonl"), "rb", buffering=0) as f:
                    st = os.fstat(f.fileno())
                    if ino != st.st_ino or seq > after or offset > st.st_size:
                        seq, offset = 0, 0
                    f.seek(offset)
                    data = f.readall()
            except FileNotFoundError:
                return []
        end = data.rfind(b"\n") + 1  # a torn last line is not an event (yet)
        lines = data[:end].split(b"\n")[:-1]
        skip = max(0, after - seq)
        out: list[ProgressEvent] = []
        for n, line in enumerate(lines[skip:], seq + skip + 1):
            if limit is not None and len(out) >= limit:
                break
            event = codec.decode_event(job_id, line)
            if event.seq != n:
                raise CorruptJob(f"job {job_id}: event line {n} holds seq {event.seq}")
            out.append(event)
        if len(self._marks) >= _MAX_MARKS:
            self._marks.clear()
        self._marks[job_id] = (st.st_ino, seq + len(lines), offset + end)
        return out

    # ------------------------------------------------------------------ transitions
    def _commit(self, job_id: str, change: machine.Change) -> list[ProgressEvent]:
        """Write a change under the job lock: events first, then the state (see above)."""
        stored = self._append(job_id, list(change.events)) if change.events else []
        self._write_state(change.state)
        return stored

    def _apply_many(
        self, items: list[tuple[str, Transition]], strict: bool = False
    ) -> list[Applied]:
        """Each job on its own, under its own lock (there is no transaction across files); a
        job that cannot be read is skipped with a warning unless ``strict``."""
        results = []
        for job_id, fn in items:
            try:
                results.append(self._apply_to(job_id, fn))
            except (JobNotFound, CorruptJob) as exc:
                if strict:
                    raise
                log.warning("not updating job %s: %s", job_id, exc)
        return results

    def _apply_to(self, job_id: str, fn: Transition) -> Applied:
        with self._translated(f"update {job_id}"), self._locked(job_id):
            state = self._load(job_id)
            change = fn(state)
            if change is None:
                return Applied(state, [])
            stored = self._commit(job_id, change)
        self.parts.pulse(job_id, machine.wakes_pools(state, change), change.interrupts)
        return Applied(change.state, stored)

    def _remove(self, job_id: str, force: bool) -> None:
        with self._translated(f"delete {job_id}"), self._locked(job_id):
            if not self._file(job_id, ".json").exists():
                raise JobNotFound(f"no job {job_id}")
            if not force:  # with force, even a corrupt document can be deleted
                status = self._load(job_id).status
                if not status.terminal:
                    why = "cancel it first or force the delete"
                    raise JobActive(f"job {job_id} is {status}; {why}")
            os.unlink(self._file(job_id, ".json"))
            self._sync_dir()
            for suffix in (".events.jsonl", ".retries"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self._file(job_id, suffix))
            self.parts.forget(job_id)
            self._marks.pop(job_id, None)
            self._scanned.pop(job_id, None)
        # the lock file went with the document, when _locked let go; a forced delete may
        # have taken a running job (a corrupt one's status cannot be read): its pool looks
        self.parts.pulse(job_id, False, interrupt=force)

    # ------------------------------------------------------------------ scans
    def _scan(self, claiming: bool = False) -> list[_Entry]:
        """An entry for every readable document; an unchanged one costs one ``stat``, and
        when ``claiming``, one seen terminal costs nothing: it can never be claimed again."""
        old, new = self._scanned, {}
        trusted_before = time.time_ns() - _RACY_NS
        with os.scandir(self.path) as it:
            for item in it:
                if not item.name.endswith(".json"):
                    continue
                job_id, known = item.name[:-5], old.get(item.name[:-5])
                if known is None and not _is_job_id(job_id):
                    continue
                if claiming and known is not None and known.status.terminal:
                    new[job_id] = known
                    continue
                try:
                    new[job_id] = self._entry(job_id, item, known, trusted_before)
                except FileNotFoundError:
                    continue  # deleted while we looked
                except CorruptJob as exc:
                    if not claiming:  # a pool polls often: say it in listings only
                        log.warning("skipping a corrupt job in the listing: %s", exc)
        self._scanned = new
        return list(new.values())

    @staticmethod
    def _entry(job_id: str, item: os.DirEntry[str], known: _Entry | None, before: int) -> _Entry:
        key = _stat_key(item.stat(follow_symlinks=False))
        if known is not None and known.trusted and known.key == key:
            return known
        st, raw = _slurp(Path(item.path))
        key = _stat_key(st)
        trusted, digest = key[2] < before, hash(raw)
        if known is not None and known.digest == digest:
            return replace(known, key=key, trusted=trusted)
        try:
            return _index(job_id, json.loads(raw), key, trusted, digest)
        except (ValueError, TypeError, KeyError, CorruptJob):
            # The full parse says what is wrong, or knows the defaults of missing fields.
            return _index(job_id, codec.decode(job_id, raw).to_dict(), key, trusted, digest)

    def _select(self, query: Filter, limit: int | None, before: str | None) -> list[JobState]:
        with self._translated("list"):
            entries = self._scan()
            if before is not None:
                cursor = next((e for e in entries if e.id == before), None)
                if cursor is None:
                    raise JobNotFound(f"no job {before} (the 'before' cursor)")
                mark = (cursor.created_at, cursor.id)
                entries = [e for e in entries if (e.created_at, e.id) < mark]
            chosen = [e for e in entries if query.matches(e)]
            chosen.sort(key=lambda e: (e.created_at, e.id), reverse=True)
            states: list[JobState] = []
            for entry in chosen:
                if limit is not None and len(states) >= limit:
                    break
                try:
                    state = self._load(entry.id)
                except JobNotFound:
                    continue
                except CorruptJob as exc:
                    log.warning("skipping a corrupt job in the listing: %s", exc)
                    continue
                if query.matches(state):  # it may have moved on since the scan
                    states.append(state)
            return states

    def _running_by_worker(self) -> dict[str, int]:
        with self._translated("count running jobs"):
            entries = self._scan(claiming=True)
        running: dict[str, int] = {}
        for e in entries:
            if e.status == Status.RUNNING and e.worker:
                running[e.worker] = running.get(e.worker, 0) + 1
        return running

    def _stats(self, now: datetime, window: float) -> Stats:
        """From the scan's index of every document (a document seen finished is not even
        looked at again)."""
        with self._translated("stats"):
            entries = self._scan(claiming=True)
        return stats_from_states(entries, now, window, self.schedules())

    def _finished_since(self, since: datetime, until: datetime) -> list[tuple[float, str, float]]:
        """From the scan's index of every document (none is parsed again)."""
        with self._translated("timeline"):
            entries = self._scan(claiming=True)
        return [
            (
                e.finished_at.timestamp(),
                str(e.status),
                ((e.started_at or e.finished_at) - e.created_at).total_seconds(),
            )
            for e in entries
            if e.status.terminal and e.finished_at is not None and e.finished_at >= since
        ]

    def _live_jobs(self) -> list[JobState]:
        with self._translated("list live jobs"):
            entries = self._scan(claiming=True)
        live = [e for e in entries if e.worker is not None and e.status in _LIVE]
        return self._load_all(e.id for e in live)

    def _load_all(self, ids: Iterable[str]) -> list[JobState]:
        states = []
        for job_id in ids:
            try:
                states.append(self._read(job_id))
            except JobNotFound:
                continue  # deleted since the scan
            except CorruptJob as exc:
                log.warning("skipping a corrupt job: %s", exc)
        return states

    def _next_due(self, queues: list[str] | None, kinds: list[Kind] | None) -> datetime | None:
        with self._translated("next due"):
            entries = self._scan(claiming=True)
        now = utcnow()
        slots, used = self._limits(), _running_by_key(entries)
        times = [
            e.run_after or now
            for e in entries
            if _claimable(e, queues, kinds) and _room(e, slots, used)
        ]
        return min(times, default=None)

    def _claim(
        self,
        worker: str,
        limit: int,
        queues: list[str] | None,
        kinds: list[Kind] | None,
        now: datetime,
        journal: Journal,
    ) -> list[tuple[JobState, Any]]:
        with self._translated("claim"):
            entries = self._scan(claiming=True)
        due = [
            e
            for e in entries
            if _claimable(e, queues, kinds) and (e.run_after is None or e.run_after <= now)
        ]
        due.sort(key=lambda e: (-e.priority, e.run_after or e.created_at, e.id))
        # The scan's count of each key's running jobs skips the jobs of a full key without
        # a look under its lock: each look counts the whole store again, so a claim behind
        # 2,000 jobs of a full key took 14 s (BENCHMARKS.md, issue #18). A key that seems to
        # have room is counted afresh under its lock, and that count is kept for the rest.
        slots, used = self._limits(), _running_by_key(entries)
        claimed: list[tuple[JobState, Any]] = []
        for entry in due:
            if len(claimed) >= limit:
                break
            if not _room(entry, slots, used):
                continue
            try:
                if entry.limit_key is not None:
                    got = self._claim_limited(entry, worker, now, journal, used)
                else:
                    got = self._claim_one(entry.id, worker, now, journal)
            except JobNotFound:
                continue  # deleted since the scan
            except CorruptJob as exc:
                log.warning("not claiming a corrupt job: %s", exc)
                continue
            except StoreError as exc:
                if not claimed:
                    raise
                # Claims already written stand (their workers hold them): return those; a
                # lasting failure is raised by the next claim.
                log.warning("claim stopped early at job %s: %s", entry.id, exc)
                break
            if got is not None:
                claimed.append(got)
        for state, _ in claimed:
            self.parts.pulse(state.id, False)
        return claimed

    def _claim_limited(
        self, entry: _Entry, worker: str, now: datetime, journal: Journal, used: dict[str, int]
    ) -> tuple[JobState, int] | None:
        """Claim a job of a concurrency key under the key's lock, once a fresh count says a
        slot is free (so two claimers of one key count one after the other); ``used`` gets
        that count of the key (and the job, when it is claimed)."""
        key = entry.limit_key
        assert key is not None
        with self._key_locked(f"limit\0{key}"):
            running = _running_by_key(self._scan(claiming=True)).get(key, 0)
            used[key] = running
            if not _room(entry, self._limits(), used):
                return None
            got = self._claim_one(entry.id, worker, now, journal)
            if got is not None:
                used[key] = running + 1
            return got

    def _claim_one(
        self, job_id: str, worker: str, now: datetime, journal: Journal
    ) -> tuple[JobState, int] | None:
        """Take the worker lock, then start the job if the document, re-read under the job
        lock, still says it is free: the job lock makes check and write one atomic step."""
        lock = self.parts.locks.try_acquire(job_id)
        if lock is None:
            return None
        claimed = None
        try:
            with self._translated(f"claim {job_id}"), self._locked(job_id):
                state = self._load(job_id)
                change = machine.start(state, worker, now) if state.worker is None else None
                if change is not None:
                    journal.claimed([(job_id, change.state.attempts)])
                    self._commit(job_id, change)
                    claimed = change.state, lock
        finally:
            if claimed is None:
                with self._translated(f"release {job_id}"):
                    self.parts.locks.release(job_id, lock)
        return claimed

    # ------------------------------------------------------------------ workers
    def _worker_dir(self) -> Path:
        folder = self.path / ".outlast" / "workers"
        make_private_dir(folder)
        return folder

    def _put_worker(self, name: str, doc: bytes) -> None:
        with self._translated(f"register {name}"):
            folder = self._worker_dir()
            path = folder / f"{worker_file_name(name)}.json"
            tmp = path.with_suffix(".tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, doc)
            finally:
                os.close(fd)
            os.replace(tmp, path)

    def _drop_worker(self, name: str) -> None:
        with self._translated(f"unregister {name}"), contextlib.suppress(FileNotFoundError):
            os.unlink(self._worker_dir() / f"{worker_file_name(name)}.json")

    def _worker_docs(self) -> list[tuple[str, bytes]]:
        found = []
        with self._translated("list workers"):
            for entry in os.scandir(self._worker_dir()):
                if not entry.name.endswith(".json"):
                    continue
                with contextlib.suppress(FileNotFoundError):
                    raw = Path(entry.path).read_bytes()
                    try:
                        name = json.loads(raw)["name"]
                    except (ValueError, KeyError, TypeError):
                        os.unlink(entry.path)  # a torn record: its writer is gone
                        continue
                    found.append((str(name), raw))
        return found

    # ------------------------------------------------------------------ schedules
    def _schedule_dir(self) -> Path:
        folder = self.path / ".outlast" / "schedules"
        if not self._schedules_made:
            make_private_dir(folder)
            self._schedules_made = True
        return folder

    @contextlib.contextmanager
    def _schedule_locked(self, name: str) -> Iterator[Path]:
        """Hold the schedule's lock; yields its document's path."""
        folder = self._schedule_dir()
        fd = os.open(folder / f"{name}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield folder / f"{name}.json"
        finally:
            os.close(fd)

    def _load_schedule(self, name: str, path: Path) -> Schedule | None:
        try:
            _, raw = _slurp(path)
        except FileNotFoundError:
            return None
        return codec.decode_schedule(name, raw)

    def _write_schedule(self, name: str, change: ScheduleChange) -> Schedule | None:
        with self._translated(f"schedule {name}"), self._schedule_locked(name) as path:
            old = self._load_schedule(name, path)
            new = change(old)
            if new is None:
                return old
            if new is REMOVE:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
                self._sync_dir(path.parent)
                return None
            assert isinstance(new, Schedule)
            self._replace(path, codec.encode_schedule(new) + b"\n")
            return new

    def _read_schedule(self, name: str) -> Schedule:
        with self._translated(f"read schedule {name}"):
            found = self._load_schedule(name, self._schedule_dir() / f"{name}.json")
        if found is None:
            raise ScheduleNotFound(f"no schedule {name}")
        return found

    def _list_schedules(self) -> list[Schedule]:
        """Every schedule; an unchanged document (same inode, size and mtime, and not
        written in the last two seconds: see ``_RACY_NS``) is not read again, so the
        maintainer's look at the next fire time each sweep costs a ``stat`` per schedule."""
        out, cache = [], {}
        trusted_before = time.time_ns() - _RACY_NS
        with self._translated("list schedules"), os.scandir(self._schedule_dir()) as it:
            for item in it:
                name = item.name[:-5]
                if not item.name.endswith(".json") or not _is_job_id(name):
                    continue
                try:
                    key = _stat_key(item.stat(follow_symlinks=False))
                    known = self._schedule_cache.get(name)
                    if known is not None and known[0] == key and key[2] < trusted_before:
                        found: Schedule | None = known[1]
                    else:
                        found = self._load_schedule(name, Path(item.path))
                except FileNotFoundError:
                    continue  # removed while we looked
                except CorruptJob as exc:
                    log.warning("skipping a corrupt schedule: %s", exc)
                    continue
                if found is not None:
                    cache[name] = (key, found)
                    out.append(found)
        self._schedule_cache = cache
        return out

    def _fire(self, now: datetime, manual: str | None) -> list[JobState]:
        """Each due schedule under its own lock: its jobs first (one that exists already is
        not made again), then the schedule moved on. A crash between the two leaves the
        schedule to fire the same fire time again, which finds its job there."""
        if manual is None:
            due = [
                s.id
                for s in self._list_schedules()
                if not s.paused and s.next_at is not None and s.next_at <= now
            ]
        else:
            due = [manual]
        made: list[JobState] = []
        for name in due:
            with self._translated(f"fire schedule {name}"), self._schedule_locked(name) as path:
                try:
                    schedule = self._load_schedule(name, path)
                except CorruptJob as exc:
                    log.warning("not firing a corrupt schedule: %s", exc)
                    continue
                if schedule is None:
                    continue
                last_live = False
                if not schedule.overlap and schedule.last_job and manual is None:
                    try:
                        last_live = live(self._load(schedule.last_job).status)
                    except (JobNotFound, CorruptJob):
                        last_live = False
                new, jobs = fire_one(schedule, now, manual is not None, last_live)
                for job in jobs:
                    with self._locked(job.id):
                        if not self._file(job.id, ".json").exists():
                            self._write_state(job)
                    self.parts.pulse(job.id, True)
                if new != schedule:
                    self._replace(path, codec.encode_schedule(new) + b"\n")
                made += jobs
        return made

    def _next_fire(self) -> datetime | None:
        """The earliest next fire time; one ``stat`` of the schedules' folder while it has
        not changed (every write of a schedule renames a file into it)."""
        folder = self._schedule_dir()
        with self._translated("next fire time"):
            mtime = os.stat(folder).st_mtime_ns
        known = self._next_fire_at
        if known is not None and known[0] == mtime and mtime < time.time_ns() - _RACY_NS:
            return known[1]
        times = [s.next_at for s in self._list_schedules() if not s.paused and s.next_at]
        due = min(times, default=None)
        self._next_fire_at = (mtime, due)
        return due

    # ------------------------------------------------------------------ retention, strays
    def _expired(self, now: datetime, cutoff: datetime | None, limit: int) -> list[JobState]:
        with self._translated("find expired jobs"):
            entries = self._scan(claiming=True)
        due = []
        for e in entries:
            if not e.status.terminal or e.finished_at is None:
                continue
            if e.keep is not None:
                if e.finished_at + timedelta(seconds=e.keep) <= now:
                    due.append(e)
            elif cutoff is not None and e.finished_at <= cutoff:
                due.append(e)
        due.sort(key=lambda e: (e.finished_at or now, e.id))
        return self._load_all(e.id for e in due[:limit])

    def _unclaimed(self, now: datetime) -> list[JobState]:
        with self._translated("find unclaimed jobs"):
            entries = self._scan(claiming=True)
        return self._load_all(
            e.id
            for e in entries
            if _parked_entry(e)
            and e.limit_key is None
            and (e.run_after is None or e.run_after <= now)
        )

    def _timed(self, after: tuple[datetime, str] | None, limit: int) -> list[JobState]:
        with self._translated("find the jobs waiting for their time"):
            entries = self._scan(claiming=True)
        timed = sorted(
            (e.run_after, e.id) for e in entries if _parked_entry(e) and e.run_after is not None
        )
        if after is not None:
            timed = [t for t in timed if t > after]
        return self._load_all(job_id for _, job_id in timed[:limit])

    def _key_usage(self, key: str) -> tuple[int | None, int]:
        with self._translated("count a key's running jobs"):
            running = _running_by_key(self._scan(claiming=True)).get(key, 0)
            return self._limits().get(key), running

    def _parked(self, key: str, now: datetime, limit: int) -> list[JobState]:
        with self._translated("find a key's parked jobs"):
            entries = self._scan(claiming=True)
        due = [
            e
            for e in entries
            if _parked_entry(e)
            and e.limit_key == key
            and (e.run_after is None or e.run_after <= now)
        ]
        due.sort(key=lambda e: (-e.priority, e.run_after or e.created_at, e.id))
        return self._load_all(e.id for e in due[:limit])

    def _waiting_by_key(self) -> dict[str, int]:
        with self._translated("count the parked jobs"):
            entries = self._scan(claiming=True)
        counts: dict[str, int] = {}
        for e in entries:
            if _parked_entry(e) and e.limit_key is not None:
                counts[e.limit_key] = counts.get(e.limit_key, 0) + 1
        return counts

    def _parked_keys(self) -> set[str]:
        with self._translated("find parked keys"):
            entries = self._scan(claiming=True)
        return {e.limit_key for e in entries if _parked_entry(e) and e.limit_key is not None}

    def change_watch(self) -> ChangeWatch:
        """A document written or removed renames or unlinks a file in the store's folder
        (and a schedule in its own): their times say when to look again."""
        return _local.StatWatch([self.path, self._schedule_dir()])

    # ------------------------------------------------------------------ concurrency keys
    def _limits(self) -> dict[str, int]:
        """The slots set per concurrency key (``.outlast/limits.json``)."""
        try:
            _, raw = _slurp(self.path / ".outlast" / "limits.json")
        except FileNotFoundError:
            return {}
        data = json.loads(raw)
        if not isinstance(data, dict):
            raise CorruptJob("the store's limits.json is not an object")
        return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, int)}

    def _set_slots(self, key: str, slots: int | None) -> None:
        with self._translated(f"slots of {key}"), self._key_locked("\0limits"):
            limits = self._limits()
            if slots is None:
                limits.pop(key, None)
            else:
                limits[key] = slots
            self._replace(self.path / ".outlast" / "limits.json", json.dumps(limits).encode())
        self.parts.pulse(f"{key}.slots", True)

    def _slot_usage(self) -> dict[str, tuple[int | None, int]]:
        with self._translated("slot usage"):
            running = _running_by_key(self._scan(claiming=True))
            slots = self._limits()
        return {k: (slots.get(k), running.get(k, 0)) for k in sorted({*running, *slots})}

    def _start_one(self, job_id: str, worker: str, now: datetime) -> Applied:
        state = self._read(job_id)
        start = partial(_start_if, worker=worker, now=now)
        if state.limit_key is None:
            return self._apply_to(job_id, start)
        with self._translated(f"start {job_id}"), self._key_locked(f"limit\0{state.limit_key}"):
            entries = self._scan(claiming=True)
            fresh = next((e for e in entries if e.id == job_id), None)
            if fresh is not None and not _room(fresh, self._limits(), _running_by_key(entries)):
                return Applied(state, [])
            return self._apply_to(job_id, start)


def _start_if(state: JobState, worker: str, now: datetime) -> machine.Change | None:
    return machine.start(state, worker, now)


def _parked_entry(e: _Entry) -> bool:
    """A pending command or spawned job that no worker is bound to."""
    return (
        e.status == Status.PENDING
        and e.worker is None
        and (e.kind == Kind.COMMAND or e.queue == DEDICATED)
    )


def _running_by_key(entries: Iterable[_Entry]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for e in entries:
        if e.limit_key is not None and e.status == Status.RUNNING:
            counts[e.limit_key] = counts.get(e.limit_key, 0) + 1
    return counts


def _room(entry: _Entry, slots: dict[str, int], used: dict[str, int]) -> bool:
    """Whether a job of a concurrency key may start (a job with none always may)."""
    if entry.limit_key is None:
        return True
    return used.get(entry.limit_key, 0) < slots.get(entry.limit_key, entry.limit or 1)
