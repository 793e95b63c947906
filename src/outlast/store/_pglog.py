"""Job logs in PostgreSQL: ``<schema>.job_logs``, one row per chunk, so any host reads them.

A writer buffers what the job prints and sends it at most :data:`FLUSH_DELAY` late (or once
:data:`FLUSH_BYTES` wait), one ``INSERT`` per flush. The rotation rule of local logs holds:
once the job's chunks pass twice ``OUTLAST_LOG_MAX_BYTES``, the oldest go, keeping the most
recent ``cap`` bytes and more; so a log never takes more than about twice the cap. Chunks
are deleted with their job (a foreign key, ``ON DELETE CASCADE``).

While the database cannot be reached the writer keeps what it buffered (the most recent
twice the cap at most) and tries again; a job's output never waits for the database.
"""

from __future__ import annotations

import time
from typing import Any

from outlast.errors import StoreError
from outlast.store import _pg
from outlast.store.common import log
from outlast.store.joblog import max_bytes, tail_lines

FLUSH_DELAY = 0.2  # seconds printed output may wait before it is sent
FLUSH_BYTES = 256 * 1024  # bytes that are sent at once
CHUNK_MAX = 1024 * 1024  # bytes of one row at most
RETRY_DELAY = 1.0  # seconds between tries while the database is away


def table_statements(schema: str) -> list[str]:
    s = f'"{schema}"'
    return [
        f"CREATE TABLE IF NOT EXISTS {s}.job_logs (job_id text NOT NULL REFERENCES {s}.jobs (id)"
        " ON DELETE CASCADE, seq bigint NOT NULL, data bytea NOT NULL,"
        " PRIMARY KEY (job_id, seq))"
    ]


class PgLogWriter:
    """Appends a job's output to its chunks (see the module)."""

    def __init__(self, db: _pg.Connections, schema: str, job_id: str) -> None:
        self.db, self.table, self.job_id = db, f'"{schema}".job_logs', job_id
        self.cap = max_bytes()
        self._buf = bytearray()
        self._due: float | None = None  # when the buffer is sent
        self._seq: int | None = None  # the last chunk's seq (read at the first flush)
        self._total = 0  # bytes stored
        self._gone = False  # the job was deleted: drop its output

    def write(self, data: bytes) -> None:
        if self._gone or not data:
            return
        self._buf += data
        if len(self._buf) > 2 * self.cap:  # only the most recent is ever kept
            del self._buf[: len(self._buf) - 2 * self.cap]
        if self._due is None:
            self._due = time.monotonic() + FLUSH_DELAY
        if len(self._buf) >= FLUSH_BYTES:
            self._flush()

    def tick(self) -> float | None:
        if self._due is None:
            return None
        left = self._due - time.monotonic()
        if left <= 0:
            self._flush()
            return None if self._due is None else max(0.0, self._due - time.monotonic())
        return left

    def close(self, tries: int = 5) -> None:
        """Send what is left (trying a few times while the database is away)."""
        for _ in range(tries):
            self._flush()
            if not self._buf or self._gone:
                return
            time.sleep(RETRY_DELAY)
        log.warning("job %s: %d bytes of its log could not be stored", self.job_id, len(self._buf))

    def _flush(self) -> None:
        if not self._buf or self._gone:
            self._due = None
            return
        data = bytes(self._buf)
        try:
            self._send(data)
        except StoreError as exc:
            if "job_logs_job_id_fkey" in str(exc) or "foreign key" in str(exc):
                self._gone, self._buf, self._due = True, bytearray(), None
                return
            self._due = time.monotonic() + RETRY_DELAY
            return
        del self._buf[: len(data)]
        self._due = None if not self._buf else time.monotonic() + FLUSH_DELAY

    def _send(self, data: bytes) -> None:
        with self.db.session(f"write the log of {self.job_id}") as conn:
            if self._seq is None:
                row = conn.execute(
                    f"SELECT coalesce(max(seq), 0), coalesce(sum(length(data)), 0)"
                    f" FROM {self.table} WHERE job_id = %s",
                    (self.job_id,),
                ).fetchone()
                assert row is not None
                self._seq, self._total = int(row[0]), int(row[1])
            rows = []
            seq = self._seq
            size = min(CHUNK_MAX, self.cap)  # so the newest chunk is never more than the cap
            for start in range(0, len(data), size):
                seq += 1
                rows.append((self.job_id, seq, data[start : start + size]))
            with conn.transaction(), conn.cursor() as cur:
                cur.executemany(
                    f"INSERT INTO {self.table} (job_id, seq, data) VALUES (%s, %s, %s)", rows
                )
                total = self._total + len(data)
                if total > 2 * self.cap:  # rotate: keep the newest chunks, cap bytes and more
                    cur.execute(
                        f"DELETE FROM {self.table} WHERE job_id = %s AND seq < ("
                        f" SELECT coalesce(min(seq), 0) FROM (SELECT seq, length(data) AS size,"
                        f" sum(length(data)) OVER (ORDER BY seq DESC) AS after FROM {self.table}"
                        " WHERE job_id = %s) newest WHERE after - size < %s)",
                        (self.job_id, self.job_id, self.cap),
                    )
                    cur.execute(
                        f"SELECT coalesce(sum(length(data)), 0) FROM {self.table}"
                        " WHERE job_id = %s",
                        (self.job_id,),
                    )
                    fetched = cur.fetchone()
                    total = int(fetched[0]) if fetched else 0
            self._seq, self._total = seq, total


class PgLogCursor:
    """Reads a job's chunks: all at first, then those added since."""

    def __init__(self, db: _pg.Connections, schema: str, job_id: str) -> None:
        self.db, self.table, self.job_id = db, f'"{schema}".job_logs', job_id
        self._seq = 0

    def read_new(self) -> bytes:
        with self.db.session(f"read the log of {self.job_id}") as conn:
            rows: list[Any] = conn.execute(
                f"SELECT seq, data FROM {self.table} WHERE job_id = %s AND seq > %s ORDER BY seq",
                (self.job_id, self._seq),
            ).fetchall()
        if not rows:
            return b""
        self._seq = int(rows[-1][0])
        return b"".join(bytes(data) for _, data in rows)

    def close(self) -> None:
        pass


def tail(db: _pg.Connections, schema: str, job_id: str, lines: int, most: int) -> str | None:
    """The last ``lines`` lines of a job's log, reading the newest chunks up to ``most``
    bytes; None when it has none."""
    table = f'"{schema}".job_logs'
    with db.session(f"read the log of {job_id}") as conn:
        rows = conn.execute(
            f"SELECT data, total FROM (SELECT seq, data, sum(length(data)) OVER (ORDER BY seq"
            f" DESC) AS total FROM {table} WHERE job_id = %s) newest"
            " WHERE total - length(data) < %s ORDER BY seq",
            (job_id, most),
        ).fetchall()
        if not rows:
            return None
        count = conn.execute(f"SELECT count(*) FROM {table} WHERE job_id = %s", (job_id,))
        everything = (count.fetchone() or (0,))[0] == len(rows)
    data = b"".join(bytes(r[0]) for r in rows)
    cut = not everything
    if len(data) > most:
        data, cut = data[-most:], True
    return tail_lines(data, lines, cut)


def read_range(
    db: _pg.Connections, schema: str, job_id: str, offset: int, limit: int
) -> tuple[bytes, int]:
    """Up to ``limit`` bytes of a job's log from byte ``offset`` of what is kept, and its
    size: only the chunks that hold the range are fetched."""
    table = f'"{schema}".job_logs'
    with db.session(f"read the log of {job_id}") as conn:
        rows = conn.execute(
            f"SELECT data, start, size FROM (SELECT seq, data, sum(length(data)) OVER w"
            f" - length(data) AS start, sum(length(data)) OVER () AS size FROM {table}"
            " WHERE job_id = %s WINDOW w AS (ORDER BY seq)) kept"
            " WHERE start + length(data) > %s AND start < %s ORDER BY seq",
            (job_id, offset, offset + limit),
        ).fetchall()
        if not rows:
            found = conn.execute(
                f"SELECT coalesce(sum(length(data)), 0) FROM {table} WHERE job_id = %s",
                (job_id,),
            ).fetchone()
            return b"", int(found[0]) if found else 0
    first = int(rows[0][1])
    data = b"".join(bytes(r[0]) for r in rows)[offset - first :][:limit]
    return data, int(rows[0][2])
