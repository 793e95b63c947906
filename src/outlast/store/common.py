"""What every adapter shares below the port: the store's logger, the one translation of driver
errors into :class:`~outlast.errors.StoreError`, reading a listing's rows, and private
folders."""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path

from outlast import codec
from outlast.errors import CorruptJob, InvalidInput, StoreError
from outlast.machine import check_labels
from outlast.model import JobState

log = logging.getLogger("outlast.store")


@contextlib.contextmanager
def translated(
    prefix: str,
    what: str,
    drivers: tuple[type[BaseException], ...] = (),
    hint: Callable[[BaseException], str | None] | None = None,
) -> Iterator[None]:
    """Turn ``OSError`` and the driver's own errors (``sqlite3.Error``, ``psycopg.Error``)
    into :class:`StoreError` (``raise … from exc``): nothing above the store ever catches a
    driver exception. The message reads ``<prefix>: <what>: <the driver's words>``, and
    ``hint(exc)``'s advice when it has some."""
    errors: tuple[type[BaseException], ...] = (OSError, *drivers)
    try:
        yield
    except errors as exc:
        advice = hint(exc) if hint is not None else None
        message = f"{prefix}: {what}: {exc}".rstrip()
        raise StoreError(f"{message} ({advice})" if advice else message) from exc


def disk_full(path: str | os.PathLike[str]) -> bool:
    """Whether the filesystem holding ``path`` has no space left (for the unprivileged)."""
    try:
        return os.statvfs(path).f_bavail == 0
    except OSError:
        return False


def decode_listing(rows: Iterable[tuple[str, bytes | str | None]]) -> list[JobState]:
    """The jobs of a listing's ``(id, document)`` rows; a corrupt one is skipped, with a
    warning, instead of failing the whole listing."""
    states = []
    for job_id, doc in rows:
        try:
            states.append(codec.decode(job_id, doc))
        except CorruptJob as exc:
            log.warning("skipping a corrupt job in the listing: %s", exc)
    return states


def make_private_dir(path: Path, warn: bool = True) -> Path:
    """Create ``path`` and any missing parents 0700 (whatever the umask allows more);
    with ``warn``, say so when the folder is open to others. A folder the store does not
    own (the one a SQLite file sits in, which may be ``/tmp``) is created, never judged."""
    try:
        missing = []
        level = path
        while not level.exists():
            missing.append(level)
            level = level.parent
        for folder in reversed(missing):
            with contextlib.suppress(FileExistsError):  # made meanwhile by another process
                folder.mkdir(mode=0o700)
        mode = stat.S_IMODE(path.stat().st_mode)
    except OSError as exc:
        raise StoreError(f"cannot create the store folder {path}: {exc}") from exc
    if warn and mode & 0o077:
        log.warning(
            "store folder %s is readable by others (mode %o); job payloads, results and logs "
            "can hold secrets: chmod 700 it",
            path,
            mode,
        )
    return path


def worker_name() -> str:
    """``host:pid`` of this process: how a job names the process that holds it."""
    return f"{os.uname().nodename}:{os.getpid()}"


def parse_label(label: str | Mapping[str, str] | None) -> dict[str, str]:
    """Labels to filter on, from ``"k=v"`` or a mapping; raises :class:`InvalidInput`."""
    if label is None:
        return {}
    if isinstance(label, str):
        key, sep, value = label.partition("=")
        if not sep or not key:
            raise InvalidInput(f"a label filter is key=value, not {label!r}")
        return {key: value}
    return check_labels(label)
