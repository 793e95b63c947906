"""Jobs counted by queue, status and kind as they change, so that ``Store.stats()`` (behind
``GET /metrics``, ``outlast stats`` and ``outlast queues``) reads a few rows instead of
counting every job the store keeps (a grouped count cost 1.6 s at 1,000,000 jobs on SQLite).

What is counted is counted in the transaction that makes the change, so the counts are
exact and a rolled-back transaction takes its counts with it.

- **SQLite** has one writer at a time: the SQL core's writers of ``jobs`` (transitions,
  inserts, fires, deletes: :class:`outlast.store.sql.SqlStore`) count the *finished* jobs,
  which are most of a store and never change again, in one row per (queue, status, kind)
  of ``job_counts``: one statement in a transaction that ends jobs (or deletes finished
  ones), none in a submit or a claim. The live jobs are counted when read, through the
  status index: a read costs what the store's backlog is, not what it keeps. Not triggers:
  any trigger on ``jobs`` costs about 20 µs per row written (a bulk insert of 20,000 jobs
  lost a fifth of its speed), and counting every status made a submit 14% slower
  (BENCHMARKS.md).
- **PostgreSQL** has many writers at once: one row per key would make every claim and
  outcome of every pool wait for the others' commits. Triggers (cheap there: a statement
  trigger for a ``COPY`` of 1,000 rows, a row trigger filtered by its ``WHEN``) append signed
  changes to ``job_count_changes`` (an insert never waits for another); a read sums the
  folded counts and the changes since, and :func:`pg_fold` moves the changes into the
  folded counts in one statement (the maintainer's prune and every stats read do it; two
  folds at once are safe: a change row is deleted, so moved, by one of them only).
"""

from __future__ import annotations

#: The statuses of a finished job (a job that never changes again), in SQL.
FINISHED = "('succeeded', 'failed', 'canceled')"


def sqlite_statements() -> list[str]:
    """SQLite: the table of the finished jobs' counts, and those of the jobs already there."""
    return [
        "CREATE TABLE IF NOT EXISTS job_counts (queue TEXT NOT NULL, status TEXT NOT NULL,"
        " kind TEXT NOT NULL, n INTEGER NOT NULL, PRIMARY KEY (queue, status, kind))"
        " WITHOUT ROWID",
        "DELETE FROM job_counts",
        "INSERT INTO job_counts (queue, status, kind, n) SELECT queue, status, kind, count(*)"
        f" FROM jobs WHERE status IN {FINISHED} GROUP BY queue, status, kind",
    ]


#: SQLite: add to (or take from) the count of a key of finished jobs.
SQLITE_ADD = (
    "INSERT INTO job_counts (queue, status, kind, n) VALUES (?, ?, ?, ?)"
    " ON CONFLICT (queue, status, kind) DO UPDATE SET n = n + excluded.n"
)

#: SQLite: the finished jobs' counts, and the live jobs counted through the status index.
SQLITE_READ = (
    "SELECT queue, status, kind, n FROM job_counts WHERE n <> 0 UNION ALL"
    " SELECT queue, status, kind, count(*) FROM jobs"
    " WHERE status IN ('pending', 'running', 'paused') GROUP BY queue, status, kind"
)


def pg_statements(schema: str) -> list[str]:
    """PostgreSQL: the folded counts, the changes since, the trigger functions and triggers
    (statement-level with transition tables for inserts and deletes, so a ``COPY`` of 1,000
    jobs appends one change row per key; row-level for a changed status, filtered by its
    ``WHEN`` before any function runs, so a progress report costs nothing), and the counts
    of the jobs already there. The triggers are made first: their lock on ``jobs`` holds
    writers back until the counts are in."""
    s = f'"{schema}"'
    changes = f"{s}.job_count_changes"

    def function(name: str, body: str) -> str:
        return (
            f"CREATE OR REPLACE FUNCTION {s}.{name}() RETURNS trigger LANGUAGE plpgsql AS"
            f" $$BEGIN {body} RETURN NULL; END$$"
        )

    moved = (
        "OLD.status IS DISTINCT FROM NEW.status OR OLD.queue IS DISTINCT FROM NEW.queue"
        " OR OLD.kind IS DISTINCT FROM NEW.kind"
    )
    return [
        f"CREATE TABLE IF NOT EXISTS {s}.job_counts (queue text NOT NULL, status text NOT NULL,"
        " kind text NOT NULL, n bigint NOT NULL, PRIMARY KEY (queue, status, kind))",
        f"CREATE TABLE IF NOT EXISTS {changes} (queue text NOT NULL, status text NOT NULL,"
        " kind text NOT NULL, n bigint NOT NULL)",
        function(
            "jobs_counted_in",
            f"INSERT INTO {changes} SELECT queue, status, kind, count(*) FROM added"
            " GROUP BY queue, status, kind;",
        ),
        function(
            "jobs_counted_out",
            f"INSERT INTO {changes} SELECT queue, status, kind, -count(*) FROM removed"
            " GROUP BY queue, status, kind;",
        ),
        function(
            "jobs_counted_move",
            f"INSERT INTO {changes} VALUES (OLD.queue, OLD.status, OLD.kind, -1),"
            " (NEW.queue, NEW.status, NEW.kind, 1);",
        ),
        f"CREATE TRIGGER jobs_counted_in AFTER INSERT ON {s}.jobs REFERENCING NEW TABLE AS"
        f" added FOR EACH STATEMENT EXECUTE FUNCTION {s}.jobs_counted_in()",
        f"CREATE TRIGGER jobs_counted_out AFTER DELETE ON {s}.jobs REFERENCING OLD TABLE AS"
        f" removed FOR EACH STATEMENT EXECUTE FUNCTION {s}.jobs_counted_out()",
        f"CREATE TRIGGER jobs_counted_move AFTER UPDATE OF status, queue, kind ON {s}.jobs"
        f" FOR EACH ROW WHEN ({moved}) EXECUTE FUNCTION {s}.jobs_counted_move()",
        f"INSERT INTO {s}.job_counts (queue, status, kind, n)"
        f" SELECT queue, status, kind, count(*) FROM {s}.jobs GROUP BY queue, status, kind",
    ]


def pg_read(schema: str) -> str:
    """PostgreSQL: the folded counts plus the changes not folded yet, in one snapshot."""
    s = f'"{schema}"'
    return (
        "SELECT queue, status, kind, sum(n) FROM (SELECT queue, status, kind, n FROM"
        f" {s}.job_counts UNION ALL SELECT queue, status, kind, n FROM {s}.job_count_changes)"
        " c GROUP BY queue, status, kind HAVING sum(n) <> 0"
    )


def pg_fold(schema: str) -> str:
    """PostgreSQL: move the changes into the folded counts, in one statement (keys in
    order, so two folds at once never deadlock)."""
    s = f'"{schema}"'
    return (
        f"WITH moved AS (DELETE FROM {s}.job_count_changes RETURNING queue, status, kind, n)"
        f" INSERT INTO {s}.job_counts AS c (queue, status, kind, n)"
        " SELECT queue, status, kind, sum(n) FROM moved GROUP BY queue, status, kind"
        " ORDER BY queue, status, kind"
        " ON CONFLICT (queue, status, kind) DO UPDATE SET n = c.n + excluded.n"
    )
