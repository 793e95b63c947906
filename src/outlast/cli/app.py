"""The ``outlast`` command line (click). Parses input, calls the store and run layers, prints.

Every verb takes ``--store URL`` (default ``$OUTLAST_STORE``, else SQLite in the user's state
directory) and most take ``--json``, which prints the job document of DESIGN.md. Errors print
one line, ``outlast: error: …``, on stderr: a user error exits 2 and writes nothing; a store
that fails (unreachable, corrupt) exits 5.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

import click

from outlast.cli import quiet_stdout, reader_gone, render
from outlast.errors import CorruptJob, InvalidInput, JobNotFound, OutlastError, StoreError
from outlast.model import EventStatus, JobState, Status
from outlast.store import Store, open_store

F = TypeVar("F", bound=Callable[..., Any])

#: Exit codes: a job failed, a user error (bad input, no such job, a move the status machine
#: does not allow), a canceled job, a job paused for an answer, the store failed (unreachable,
#: corrupt), timed out.
EXIT_FAILED, EXIT_USAGE, EXIT_CANCELED, EXIT_PAUSED, EXIT_STORE, EXIT_TIMEOUT = 1, 2, 3, 4, 5, 124


_STORE_HELP = "Store URL (sqlite:///abs.db, files:///abs/dir, postgresql://…); $OUTLAST_STORE."
_JSON_HELP = "Print JSON (the job document)."
#: Where the options given before the verb (``outlast --store URL --json ls``) wait for it.
_GLOBAL_STORE, _GLOBAL_JSON = "outlast.store", "outlast.json"


def _global_store(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A verb's ``--store``: its own when given, else the one before the verb, else
    ``$OUTLAST_STORE``."""
    if ctx.get_parameter_source(param.name or "") == click.core.ParameterSource.COMMANDLINE:
        return value
    given: str | None = ctx.meta.get(_GLOBAL_STORE)
    return given if given is not None else value


def _global_json(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
    return value or bool(ctx.meta.get(_GLOBAL_JSON))


def store_option(fn: F) -> F:
    return click.option(
        "--store",
        "store_url",
        metavar="URL",
        envvar="OUTLAST_STORE",
        callback=_global_store,
        help=_STORE_HELP,
    )(fn)


def json_option(fn: F) -> F:
    return click.option("--json", "as_json", is_flag=True, callback=_global_json, help=_JSON_HELP)(
        fn
    )


def _open(url: str | None, create: bool = False) -> Store:
    """The store a verb works on. Only the verbs that create jobs (run, submit, spawn) create
    a store that is not there yet; for the others a missing store is an error naming it."""
    return open_store(url or None, create=create)


def _print_job(state: JobState, as_json: bool) -> None:
    doc = state.to_dict()
    click.echo(render.dumps(doc) if as_json else render.job_text(doc))


def parse_labels(values: tuple[str, ...]) -> dict[str, str]:
    labels = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"a label is key=value, not {item!r}", param_hint="--label")
        labels[key] = value
    return labels


#: The JSON options whose value must be a list or an object (the others take any value).
_JSON_SHAPES = {"--args": list, "--kwargs": dict, "--payload": dict}


def _json_hint(text: str, what: str) -> str:
    """How to write ``text`` as the JSON that option ``what`` takes."""
    shape = _JSON_SHAPES.get(what)
    if shape is list:
        listed = json.dumps([text], ensure_ascii=False)
        return f"to pass a list of strings, write it as JSON: '{listed}'"
    if shape is dict:
        return """to pass an object, write it as JSON: '{"key": "value"}'"""
    return f"to pass a string, quote it: '{json.dumps(text, ensure_ascii=False)}'"


def parse_json(text: str | None, what: str) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError as exc:
        hint = _json_hint(text, what)
        raise click.BadParameter(f"not JSON ({exc}): {hint}", param_hint=what) from None


def parse_duration(text: str | None, hint: str) -> float | None:
    """Seconds in ``90s``, ``15m``, ``12h``, ``7d``, ``1h30m`` or a bare number of seconds
    (the one parser of :mod:`outlast.when`); None for None."""
    if text is None:
        return None
    from outlast.when import parse_duration as parse

    try:
        return parse(text, "a duration")
    except InvalidInput as exc:
        raise click.BadParameter(str(exc), param_hint=hint) from None


def due_time(delay: str | None, at: str | None) -> Any:
    """When a job given ``--in`` or ``--at`` runs (None: now); a time already past runs now,
    and the user is told."""
    from outlast.when import due_time as due

    if delay is not None and at is not None:
        raise click.UsageError("give --in or --at, not both")
    if delay is not None:
        parse_duration(delay, "--in")
    try:
        run_after, past = due(delay, at)
    except InvalidInput as exc:
        raise click.BadParameter(str(exc), param_hint="--at") from None
    if past:
        click.echo(f"outlast: --at {at} is in the past; the job runs now", err=True)
    return run_after


def time_options(fn: F) -> F:
    """``--in``, ``--at``, ``--timeout`` and ``--keep``, shared by run, submit and spawn."""
    for option in reversed(
        [
            click.option(
                "--in",
                "--delay",
                "delay",
                metavar="DURATION",
                help="Run no sooner than this from now: 90s, 15m, 12h, 7d, 1h30m.",
            ),
            click.option(
                "--at",
                "at",
                metavar="TIME",
                help="Run at this time, ISO 8601 with a zone: 2026-12-24T03:00Z (past: now).",
            ),
            click.option(
                "--timeout",
                metavar="DURATION",
                help="Stop each attempt after this long (code timeout): 30s, 10m, 2h.",
            ),
            click.option(
                "--keep",
                metavar="DURATION",
                help="Remove the finished job after this long (default: $OUTLAST_KEEP).",
            ),
            click.option(
                "--priority",
                type=click.IntRange(-1_000_000, 1_000_000),
                help="Higher runs first (default 0; a registered job's own).",
            ),
            click.option(
                "--unique",
                "unique_key",
                metavar="KEY",
                help="While a live job holds KEY, print that job instead of making another.",
            ),
            click.option(
                "--on-conflict",
                type=click.Choice(["return", "raise"]),
                default="return",
                show_default=True,
                help="raise: a live job holding --unique KEY is an error (exit 2).",
            ),
        ]
    ):
        fn = option(fn)
    return fn


_TICK = timedelta(microseconds=1)


def _one_line(message: str) -> str:
    """A driver's several-line message (libpq's hints) as one line."""
    return "; ".join(part.strip() for part in message.splitlines() if part.strip())


#: What each verb's exit codes mean beyond 0 (done), 2 (a user error) and 5 (the store
#: failed), shown at the end of its ``--help``.
_EXITS = {
    "wait": "0 succeeded, 1 failed, 3 canceled (its processes are gone), 4 paused for an answer"
    " (unless --through-pause), 124 timed out",
    "watch": "0 succeeded, 1 failed, 3 canceled",
    "worker": "0 stopped (SIGTERM/SIGINT, or --burst found no job), 130 interrupted",
    "serve": "0 stopped",
}
_EXITS_COMMON = (
    "2 a user error (bad input, no such job, a move the job's status does not allow), 5 the"
    " store failed (unreachable, corrupt)"
)


class Command(click.Command):
    """A verb: refuses ``--json`` given before a verb that prints no JSON, and ends its help
    with its exit codes."""

    def invoke(self, ctx: click.Context) -> Any:
        if ctx.meta.get(_GLOBAL_JSON) and not any(p.name == "as_json" for p in self.params):
            raise click.UsageError(f"{ctx.command_path} prints no JSON: drop --json")
        _QUICK[0] = (
            ctx.parent is not None and ctx.parent.parent is None and (self.name in QUICK_EXIT)
        )
        return super().invoke(ctx)

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        super().format_epilog(ctx, formatter)
        codes = _EXITS.get(self.name or "", "0 done")
        formatter.write_paragraph()
        formatter.write_text(f"Exit codes: {codes}; {_EXITS_COMMON}.")


class _ReaderGone(Exception):
    """The reader of this process's output went away (see :meth:`Cli.invoke`)."""


class Cli(click.Group):
    """Turns outlast's errors and click's usage errors into one line on stderr: exit 2 for a
    user's error, 5 when the store failed."""

    command_class = Command
    group_class = type  # `schedule` and `group` are made like this one

    #: Set by :func:`run_cli` (the real command line, not a test's runner): a verb of
    #: :data:`QUICK_EXIT` then ends the process at once once its output is flushed.
    quick_exit = False

    def invoke(self, ctx: click.Context) -> Any:
        """Run the verb. A broken pipe is told apart here, before click's ``main`` sees it
        (which ends any, with exit 1 and no word): the reader of our output went away
        (``outlast ls | head -1``: exit 0, quietly), or a pipe of outlast's own broke, an
        error with its traceback."""
        try:
            return super().invoke(ctx)
        except BrokenPipeError as exc:
            if reader_gone():
                quiet_stdout()
                raise _ReaderGone from None
            raise RuntimeError(f"a pipe of outlast's own broke: {exc}") from exc

    def main(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["standalone_mode"] = False
        try:
            code = super().main(*args, **kwargs)
        except SystemExit as exc:  # a verb's own exit code (wait, watch)
            self._leave(exc.code if isinstance(exc.code, int) else EXIT_USAGE)
        except click.exceptions.Exit as exc:
            self._leave(exc.exit_code)
        except click.Abort:
            click.echo("outlast: aborted", err=True)
            self._leave(130)
        except click.UsageError as exc:
            click.echo(f"outlast: error: {exc.format_message()}", err=True)
            self._leave(EXIT_USAGE)
        except click.ClickException as exc:
            click.echo(f"outlast: error: {exc.format_message()}", err=True)
            self._leave(exc.exit_code)
        except (StoreError, CorruptJob) as exc:
            click.echo(f"outlast: error: {_one_line(str(exc))}", err=True)
            self._leave(EXIT_STORE)
        except OutlastError as exc:
            click.echo(f"outlast: error: {_one_line(str(exc))}", err=True)
            self._leave(EXIT_USAGE)
        except KeyboardInterrupt:
            self._leave(130)
        except _ReaderGone:
            self._leave(0)
        except BrokenPipeError:  # outside a verb
            if not reader_gone():
                raise
            quiet_stdout()
            self._leave(0)
        self._leave(code if isinstance(code, int) else 0)

    def _leave(self, code: int) -> None:
        if self.quick_exit and _QUICK[0]:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            except (BrokenPipeError, ValueError):
                pass
            os._exit(code)
        sys.exit(code)


#: Verbs that only read the store and print: once their output is flushed (and the store
#: closed, by their ``with``), the process ends at once instead of tearing the interpreter
#: down, which costs 15-60 ms (psycopg's modules the most) that a script or an agent calling
#: them in a loop would wait for (BENCHMARKS.md, issue #17).
QUICK_EXIT = frozenset({"status", "ls", "wait", "logs", "watch", "stats", "workers", "queues"})
_QUICK = [False]  # the verb being run is one of QUICK_EXIT


@click.group(cls=Cli, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="outlast")
@click.option(
    "--store",
    "store_url",
    metavar="URL",
    help="Store URL for any verb (or after the verb).",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON (or after the verb).")
@click.pass_context
def cli(ctx: click.Context, store_url: str | None, as_json: bool) -> None:
    """outlast: background jobs that outlast the process that started them.

    Exit codes of every verb: 0 done, 2 a user error (bad input, no such job, a move the
    job's status does not allow; one line on stderr, nothing written), 5 the store failed
    (unreachable, corrupt). wait and watch add a job's outcome: 1 failed, 3 canceled, 4 paused
    for an answer (wait), 124 timed out (wait).
    """
    ctx.meta[_GLOBAL_STORE] = store_url
    ctx.meta[_GLOBAL_JSON] = as_json


@cli.command(context_settings={"allow_interspersed_args": False})
@click.option("--name", help="A name for the job (default: the command).")
@click.option(
    "--group",
    metavar="NAME",
    help="Run in a group: waits while its slots (outlast group set) are taken.",
)
@click.option("--label", "labels", multiple=True, metavar="K=V", help="Label the job (repeatable).")
@click.option(
    "--attempts",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Attempts before a failure is final (retried with backoff).",
)
@click.option(
    "--grace",
    type=click.FloatRange(min=0),
    default=10.0,
    show_default=True,
    help="Seconds between SIGTERM and SIGKILL on cancel.",
)
@time_options
@json_option
@store_option
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def run(
    name: str | None,
    group: str | None,
    labels: tuple[str, ...],
    attempts: int,
    grace: float,
    delay: str | None,
    at: str | None,
    timeout: str | None,
    keep: str | None,
    priority: int | None,
    unique_key: str | None,
    on_conflict: str,
    as_json: bool,
    store_url: str | None,
    command: tuple[str, ...],
) -> None:
    """Run COMMAND as a detached job and print its id at once.

    Use -- before the command: outlast run --name build -- make -j4. With --in or --at the
    job waits for that time: up to 5 s ahead its supervisor starts now and waits; further
    ahead the job waits with no process, and the store's timer starts it then.
    """
    if not command:
        raise click.UsageError("no command given: outlast run [OPTIONS] -- COMMAND [ARGS]...")
    parsed = parse_labels(labels)
    run_after = due_time(delay, at)
    seconds = parse_duration(timeout, "--timeout")
    if seconds == 0:
        raise click.BadParameter("must be more than 0", param_hint="--timeout")
    kept = parse_duration(keep, "--keep")
    from outlast.run.api import run_command

    with _open(store_url, create=True) as store:
        task = run_command(
            list(command),
            name=name,
            labels=parsed,
            attempts=attempts,
            grace=grace,
            store=store,
            at=run_after,
            timeout=seconds,
            keep=kept,
            priority=priority or 0,
            unique_key=unique_key,
            on_conflict=on_conflict,
            group=group,
        )
        if as_json:
            _print_job(task.state(), True)
        else:
            click.echo(task.id)


@cli.command()
@click.argument("job_id")
@click.option(
    "--traceback",
    "tracebacks",
    is_flag=True,
    help="Show the error and traceback of every failed attempt, oldest first.",
)
@json_option
@store_option
def status(job_id: str, tracebacks: bool, as_json: bool, store_url: str | None) -> None:
    """Show one job (reconciling it first if its worker died), with the traceback of its
    last failure; --json: the job document (the traceback under error.traceback)."""
    from outlast.run.reap import reconcile

    with _open(store_url) as store:
        state = reconcile(store, store.get(job_id))
        retries = [] if as_json or not state.terminal else store.retries_of(job_id)
        events = [e.to_dict() for e in store.events(job_id)] if tracebacks else []
    if tracebacks and as_json:
        failed = [e for e in events if e.get("status") == "failed"]
        click.echo(render.dumps({"job": state.to_dict(), "failures": failed}))
        return
    _print_job(state, as_json)
    if retries:
        click.echo(f"retried as: {' '.join(retries)}")
    if tracebacks:
        click.echo("\n" + render.attempt_tracebacks(events))


@cli.command()
@click.option(
    "--window",
    metavar="DURATION",
    default="1h",
    show_default=True,
    help="How far back the finished jobs' figures look.",
)
@click.option(
    "--timeline",
    is_flag=True,
    help="Per step of the window instead: jobs finished by outcome, their wait p50/p95 "
    "(what GET /stats/timeline answers).",
)
@click.option(
    "--step", metavar="DURATION", default="1m", show_default=True, help="With --timeline."
)
@json_option
@store_option
def stats(window: str, timeline: bool, step: str, as_json: bool, store_url: str | None) -> None:
    """The store at a glance: jobs by status and queue, the oldest due job per queue, the
    finished jobs of the last hour (waits, run times), busy workers, schedules; what GET
    /metrics serves."""
    seconds = parse_duration(window, "--window")
    if not seconds:
        raise click.BadParameter("must be more than 0", param_hint="--window")
    with _open(store_url) as store:
        if timeline:
            doc = store.timeline(seconds, parse_duration(step, "--step") or 0).to_dict()
            click.echo(render.dumps(doc) if as_json else render.timeline_table(doc))
            return
        doc = store.stats(seconds).to_dict()
    click.echo(render.dumps(doc) if as_json else render.stats_text(doc))


@cli.command()
@json_option
@store_option
def workers(as_json: bool, store_url: str | None) -> None:
    """The live workers of the store: pools, servers, schedulers, supervisors and dedicated
    workers, on every host (a dead one is never listed: liveness is its lock)."""
    with _open(store_url) as store:
        docs = store.workers()
    click.echo(render.dumps(docs) if as_json else render.workers_table(docs))


@cli.command()
@json_option
@store_option
def queues(as_json: bool, store_url: str | None) -> None:
    """Every queue that holds jobs: pending, running and paused jobs, and how long the
    oldest due job has waited."""
    with _open(store_url) as store:
        found = store.stats().by_queue()
    docs = [{"name": name, **queue} for name, queue in found.items()]
    click.echo(render.dumps(docs) if as_json else render.queues_table(docs))


@cli.command(name="ls")
@click.option("--status", "status_", type=click.Choice([s.value for s in Status]))
@click.option("--label", metavar="K=V", help="Only jobs with this label.")
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True)
@click.option("--before", metavar="ID", help="Page: jobs older than this one.")
@click.option("--name", metavar="TEXT", help="Only jobs whose name holds TEXT (any case).")
@click.option("--id-prefix", metavar="PREFIX", help="Only jobs whose id starts with PREFIX.")
@json_option
@store_option
def ls(
    status_: str | None,
    label: str | None,
    limit: int,
    before: str | None,
    name: str | None,
    id_prefix: str | None,
    as_json: bool,
    store_url: str | None,
) -> None:
    """List jobs, newest first; the filters given must all hold.

    --json prints what GET /jobs answers: {"jobs": [job documents], "next": ID or null};
    pass "next" as --before for the following page (null: this was the last).
    """
    from outlast.run.reap import reconcile

    if label is not None:
        parse_labels((label,))
    with _open(store_url) as store:
        try:
            found = store.list(
                status=status_,
                label=label,
                limit=limit,
                before=before,
                name=name,
                id_prefix=id_prefix,
            )
        except JobNotFound:
            raise click.BadParameter(
                f'no job {before!r}: pass the id of a listed job (the "next" of --json)',
                param_hint="--before",
            ) from None
        states = [s if s.terminal else reconcile(store, s) for s in found]
    docs = [s.to_dict() for s in states]
    if as_json:
        cursor = states[-1].id if len(states) == limit else None
        click.echo(render.dumps({"jobs": docs, "next": cursor}))
    else:
        click.echo(render.jobs_table(docs))


@cli.command()
@click.argument("job_id")
@click.option("--timeout", type=click.FloatRange(min=0), help="Give up after S seconds (exit 124).")
@click.option(
    "--through-pause",
    is_flag=True,
    help="Wait on while the job is paused for an answer (default: return at once, exit 4).",
)
@json_option
@store_option
def wait(
    job_id: str, timeout: float | None, through_pause: bool, as_json: bool, store_url: str | None
) -> None:
    """Wait until a job ends, or pauses for an answer.

    Exit 0 succeeded, 1 failed, 3 canceled (once its processes are gone), 4 paused (the
    question is printed; --json carries it as "question"; answer with outlast resume), 124
    timed out. --through-pause waits on through pauses.
    """
    from outlast.run.reap import wait_for

    with _open(store_url) as store:
        state = wait_for(store, job_id, timeout, through_pause)
    if as_json:
        _print_job(state, True)
    codes = {Status.SUCCEEDED: 0, Status.FAILED: EXIT_FAILED, Status.CANCELED: EXIT_CANCELED}
    if state.status == Status.PAUSED and not through_pause:
        if not as_json:
            question = json.dumps(state.question, ensure_ascii=False)
            click.echo(f"{job_id} paused: {question}")
            click.echo(f"answer with: outlast resume {job_id} --answer JSON", err=True)
        sys.exit(EXIT_PAUSED)
    if not state.terminal:
        click.echo(f"outlast: timed out; job {job_id} is {state.status}", err=True)
        sys.exit(EXIT_TIMEOUT)
    if not as_json:
        click.echo(f"{job_id} {state.status}")
    sys.exit(codes[state.status])


@cli.command()
@click.argument("job_id")
@store_option
def watch(job_id: str, store_url: str | None) -> None:
    """Follow a job's progress live until it ends (plain lines when not a terminal)."""
    from outlast.cli import live

    with _open(store_url) as store:
        state = live.watch(store, job_id, fancy=sys.stdout.isatty())
    sys.exit({Status.SUCCEEDED: 0, Status.CANCELED: EXIT_CANCELED}.get(state.status, EXIT_FAILED))


@cli.command()
@click.argument("job_id")
@click.option("-f", "--follow", is_flag=True, help="Keep printing until the job ends.")
@click.option("--tail", type=click.IntRange(1, 10_000), metavar="N", help="Its last N lines.")
@click.option(
    "--offset",
    type=click.IntRange(min=0),
    metavar="BYTES",
    help="From this byte on (with --json: pass its next_offset back to read on).",
)
@click.option(
    "--limit",
    type=click.IntRange(1, 1024 * 1024),
    default=65536,
    show_default=True,
    help="With --offset: bytes at most.",
)
@json_option
@store_option
def logs(
    job_id: str,
    follow: bool,
    tail: int | None,
    offset: int | None,
    limit: int,
    as_json: bool,
    store_url: str | None,
) -> None:
    """Print a job's output (stdout and stderr, interleaved). --tail N or --offset B: a
    piece of it; --json: {text, offset, next_offset, size, done}, as the MCP logs tool."""
    from outlast.run import logs as joblogs
    from outlast.run.reap import reconcile

    if follow and (tail is not None or offset is not None or as_json):
        raise click.UsageError("--follow prints as it comes: no --tail, --offset or --json")
    if tail is not None and offset is not None:
        raise click.UsageError("--tail or --offset, not both")
    with _open(store_url) as store:
        state = store.get(job_id)  # unknown id: a clear error
        if as_json or tail is not None or offset is not None:
            finished = (state if state.terminal else reconcile(store, state)).terminal
            piece = joblogs.read_slice(store, job_id, offset or 0, limit, tail, finished)
            click.echo(render.dumps(piece) if as_json else piece["text"], nl=False)
            if as_json:
                click.echo()
            return
        if not follow:
            cursor = store.log_cursor(job_id)
            joblogs.write_stdout(cursor.read_new())
            cursor.close()
            return
        with store.listen([job_id]) as listener:
            joblogs.follow(
                store,
                job_id,
                joblogs.write_stdout,
                lambda: reconcile(store, store.get(job_id)).terminal,
                listener.fileno(),
                listener.drain,
            )


def bulk_options(fn: F) -> F:
    """``--status``, ``--label``, ``--since``, ``--yes``, ``--dry-run``: the filters and the
    confirmation of a bulk action (retry, cancel, rm)."""
    for option in reversed(
        [
            click.option(
                "--status",
                "status_",
                type=click.Choice([s.value for s in Status]),
                help="Every job of this status.",
            ),
            click.option("--label", metavar="K=V", help="Only jobs with this label."),
            click.option("--since", metavar="DURATION", help="Only jobs made within this: 1h."),
            click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation."),
            click.option("--dry-run", is_flag=True, help="Only list the jobs it would act on."),
        ]
    ):
        fn = option(fn)
    return fn


def _bulk(
    store: Store,
    verb: str,
    ids: tuple[str, ...],
    status_: str | None,
    label: str | None,
    since: str | None,
    yes: bool,
    dry_run: bool,
) -> list[JobState] | None:
    """The jobs a bulk ``verb`` acts on, once confirmed (None: nothing to do, said so)."""
    from outlast.run.api import select_jobs

    if label is not None:
        parse_labels((label,))
    if since is not None:
        parse_duration(since, "--since")
    filtered = status_ is not None or label is not None or since is not None
    if not ids and not filtered:
        raise click.UsageError(f"give job ids, or --status/--label/--since: outlast {verb} ID…")
    states = select_jobs(store, ids=list(ids), status=status_, label=label, since=since)
    if dry_run:
        for state in states:
            click.echo(f"{state.id}  {state.status}  {state.name}")
        click.echo(f"would {verb} {len(states)} job(s)")
        return None
    if not states:
        click.echo(f"no job to {verb}")
        return None
    if filtered and not yes:
        if not sys.stdin.isatty():
            raise click.UsageError(
                f"{len(states)} job(s) match: pass --yes to {verb} them (--dry-run lists them)"
            )
        click.confirm(f"{verb} {len(states)} job(s)?", abort=True, err=True)
    return states


@cli.command()
@click.argument("job_ids", nargs=-1, metavar="[ID]...")
@bulk_options
@json_option
@store_option
def cancel(
    job_ids: tuple[str, ...],
    status_: str | None,
    label: str | None,
    since: str | None,
    yes: bool,
    dry_run: bool,
    as_json: bool,
    store_url: str | None,
) -> None:
    """Cancel jobs: their workers get SIGTERM, then SIGKILL after the grace period. By id,
    or every job matching --status/--label/--since (asks first, unless --yes)."""
    from outlast.run.reap import cancel as cancel_job

    with _open(store_url) as store:
        states = _bulk(store, "cancel", job_ids, status_, label, since, yes, dry_run)
        if states is None:
            return
        docs = []
        for state in states:
            before, after = cancel_job(store, state.id)
            docs.append(after.to_dict())
            if as_json:
                continue
            if before.terminal:
                click.echo(f"{state.id} had already {before.status}; nothing to cancel")
            elif not after.terminal:
                click.echo(f"{state.id} cancel requested: its cleanup stages run first")
            else:
                click.echo(f"{state.id} canceled")
    if as_json:
        click.echo(render.dumps(docs[0] if len(job_ids) == 1 else {"jobs": docs}))


@cli.command()
@click.argument("job_ids", nargs=-1, metavar="[ID]...")
@bulk_options
@json_option
@store_option
def retry(
    job_ids: tuple[str, ...],
    status_: str | None,
    label: str | None,
    since: str | None,
    yes: bool,
    dry_run: bool,
    as_json: bool,
    store_url: str | None,
) -> None:
    """Run finished jobs again: a new job each, with the same definition, linked by
    retry_of (the finished ones stay as they were); prints the new ids. By id, or every job
    matching --status/--label/--since (asks first, unless --yes). A retried command runs
    here, in this folder and environment."""
    from outlast.run.api import retry as retry_jobs

    with _open(store_url) as store:
        states = _bulk(store, "retry", job_ids, status_, label, since, yes, dry_run)
        if states is None:
            return
        tasks = retry_jobs([s.id for s in states], store=store)
        made = [t.state() for t in tasks]
    if as_json:
        docs = [m.to_dict() for m in made]
        click.echo(render.dumps(docs[0] if len(job_ids) == 1 else {"jobs": docs}))
        return
    for old, new in zip(states, made, strict=True):
        note = "" if new.retry_of == old.id else f" (a live job holds its key {new.unique_key!r})"
        click.echo(f"{new.id}{note}" if len(states) == 1 else f"{old.id} -> {new.id}{note}")


@cli.command(name="rm")
@click.argument("job_ids", nargs=-1, metavar="[ID]...")
@click.option("--force", is_flag=True, help="Cancel and remove a job that is still live.")
@bulk_options
@store_option
def rm(
    job_ids: tuple[str, ...],
    force: bool,
    status_: str | None,
    label: str | None,
    since: str | None,
    yes: bool,
    dry_run: bool,
    store_url: str | None,
) -> None:
    """Remove finished jobs, with their events and logs: by id, or every job matching
    --status/--label/--since (asks first, unless --yes)."""
    from outlast.run.api import delete_jobs

    with _open(store_url) as store:
        states = _bulk(store, "remove", job_ids, status_, label, since, yes, dry_run)
        for job_id in delete_jobs([s.id for s in states or []], store, force=force):
            click.echo(f"{job_id} removed")


@cli.command()
@click.option(
    "--older-than",
    "older_than",
    metavar="DURATION",
    help="Remove jobs finished longer ago than this (90s, 15m, 12h, 7d), whatever their keep.",
)
@click.option("--dry-run", is_flag=True, help="Only list what would be removed.")
@click.option(
    "--limit", type=click.IntRange(min=1), default=10000, show_default=True, help="At most."
)
@json_option
@store_option
def prune(
    older_than: str | None, dry_run: bool, limit: int, as_json: bool, store_url: str | None
) -> None:
    """Remove finished jobs (with their events and logs) that retention says are due:
    each job's own --keep, else $OUTLAST_KEEP; or all finished --older-than DURATION.
    The store's maintainer (any pool or server) does this on its own once a minute."""
    from outlast import config
    from outlast.model import utcnow

    keep = parse_duration(older_than, "--older-than") if older_than else config.keep()
    if keep is None and older_than is None:
        click.echo("outlast: $OUTLAST_KEEP is not set: only jobs with their own keep", err=True)
    now = utcnow()
    with _open(store_url) as store:
        if older_than is not None:  # every finished job older than that, whatever its keep
            from datetime import timedelta

            cutoff = now - timedelta(seconds=keep or 0)
            due = [
                s
                for status_ in ("succeeded", "failed", "canceled")
                for s in store.list(status=status_, limit=None)
                if (s.finished_at or s.updated_at) <= cutoff
            ]
            due = sorted(due, key=lambda s: s.finished_at or s.updated_at)[:limit]
        else:
            due = store.expired(now, keep, limit)
        removed = []
        for state in due:
            if not dry_run:
                try:
                    store.delete(state.id)
                except OutlastError as exc:  # retried or deleted meanwhile
                    click.echo(f"outlast: {state.id}: {exc}", err=True)
                    continue
            removed.append(state)
    if as_json:
        docs = [
            {"id": s.id, "name": s.name, "finished_at": s.to_dict()["finished_at"]} for s in removed
        ]
        click.echo(render.dumps({"dry_run": dry_run, "jobs": docs}))
        return
    for state in removed if dry_run else []:
        click.echo(
            f"{state.id}  {state.status}  finished {state.to_dict()['finished_at']}  {state.name}"
        )
    click.echo(f"{'would remove' if dry_run else 'removed'} {len(removed)} job(s)")


@cli.command()
@click.option("--step", required=True, help="The step this report is about.")
@click.option(
    "--status",
    "status_",
    type=click.Choice([s.value for s in EventStatus]),
    default="progress",
    show_default=True,
)
@click.option("--progress", type=click.FloatRange(0, 100), help="Percent done, 0-100.")
@click.option("--message", help="JSON: a string in quotes, an object, a number…")
@click.option(
    "--job",
    "job_id",
    envvar="OUTLAST_JOB_ID",
    metavar="ID",
    help="The job (default $OUTLAST_JOB_ID, set inside a job).",
)
@json_option
@store_option
def report(
    step: str,
    status_: str,
    progress: float | None,
    message: str | None,
    job_id: str | None,
    as_json: bool,
    store_url: str | None,
) -> None:
    """Report progress from inside a job (run by `outlast run`)."""
    if not job_id:
        raise click.UsageError("no job: run this inside a job ($OUTLAST_JOB_ID) or pass --job")
    parsed = parse_json(message, "--message")
    with _open(store_url) as store:
        event = store.open(job_id).report(step, status_, parsed, progress)
    if event is None:
        click.echo(f"outlast: job {job_id} has finished; the report was ignored", err=True)
    elif as_json:
        click.echo(render.dumps(event.to_dict()))


def _queue_name(value: str) -> str:
    from outlast.ids import check_queue

    try:
        return check_queue(value)
    except InvalidInput as exc:
        raise click.BadParameter(str(exc), param_hint="--queue") from None


def job_input_options(fn: F) -> F:
    """The options of a registered job's input, shared by ``submit`` and ``spawn``."""
    for option in reversed(
        [
            click.argument("name"),
            click.option(
                "--args", "args_json", metavar="JSON", help="Positional arguments: a JSON list."
            ),
            click.option(
                "--kwargs", "kwargs_json", metavar="JSON", help="Keyword arguments: a JSON object."
            ),
            click.option(
                "--payload",
                "payload_json",
                metavar="JSON",
                help="A pipeline's input: a JSON object.",
            ),
            click.option("--label", "labels", multiple=True, metavar="K=V", help="Label the job."),
            click.option(
                "--limit-key",
                metavar="KEY",
                help="A concurrency key for this call (default: the job's, from its arguments).",
            ),
            click.option(
                "--limit",
                type=click.IntRange(1, 100_000),
                help="Slots of --limit-key: jobs of the key running at once.",
            ),
            click.option(
                "--import",
                "imports",
                multiple=True,
                metavar="MODULE",
                help="Import MODULE first (where the job is registered).",
            ),
            time_options,
            json_option,
            store_option,
        ]
    ):
        fn = option(fn)
    return fn


def _create_job(
    name: str,
    args_json: str | None,
    kwargs_json: str | None,
    payload_json: str | None,
    queue: str | None,
    labels: tuple[str, ...],
    imports: tuple[str, ...],
    as_json: bool,
    store_url: str | None,
    detach: bool,
    delay: str | None = None,
    at: str | None = None,
    timeout: str | None = None,
    keep: str | None = None,
    priority: int | None = None,
    unique_key: str | None = None,
    on_conflict: str = "return",
    limit_key: str | None = None,
    limit: int | None = None,
) -> None:
    args = parse_json(args_json, "--args") if args_json is not None else []
    kwargs = parse_json(kwargs_json, "--kwargs") if kwargs_json is not None else {}
    if not isinstance(args, list):
        raise click.BadParameter("must be a JSON list", param_hint="--args")
    if not isinstance(kwargs, dict):
        raise click.BadParameter("must be a JSON object", param_hint="--kwargs")
    payload = parse_json(payload_json, "--payload")
    if payload_json is not None and not isinstance(payload, dict):
        raise click.BadParameter("must be a JSON object", param_hint="--payload")
    parsed_labels = parse_labels(labels)
    if queue is not None:
        _queue_name(queue)
    from outlast.run import registry
    from outlast.run.api import create_job, spawn_job

    registry.import_modules(list(imports))
    spec = registry.lookup(name)
    if spec.kind == "pipeline" and (args or kwargs):
        raise click.UsageError("a pipeline takes --payload JSON, not --args/--kwargs")
    if spec.kind != "pipeline" and payload is not None:
        raise click.UsageError("--payload is for pipelines; a function takes --args/--kwargs")
    if detach and queue is not None:
        raise click.UsageError("a spawned job runs in its own worker: no --queue")
    seconds = parse_duration(timeout, "--timeout")
    if seconds == 0:
        raise click.BadParameter("must be more than 0", param_hint="--timeout")
    options: dict[str, Any] = {
        "labels": parsed_labels,
        "payload": payload,
        "run_after": due_time(delay, at),
        "timeout": seconds,
        "keep": parse_duration(keep, "--keep"),
        "priority": priority,
        "unique_key": unique_key,
        "on_conflict": on_conflict,
        "limit_key": limit_key,
        "limit": limit,
    }
    if limit is not None and limit_key is None and spec.limit_key is None:
        raise click.UsageError("--limit needs --limit-key (or a job declared with limit_key=)")
    with _open(store_url, create=True) as store:
        if detach:
            task = spawn_job(store, spec, args, kwargs, **options)
        else:
            task = create_job(store, spec, args, kwargs, queue=queue, **options)
        if as_json:
            _print_job(task.state(), True)
        else:
            click.echo(task.id)


@cli.command()
@job_input_options
@click.option("--queue", help="Queue (default: the job's own).")
@click.option(
    "--from-file",
    "from_file",
    type=click.File("r", encoding="utf-8"),
    metavar="FILE",
    help="Many jobs of NAME: one JSON object a line (args, kwargs, payload, queue, labels,"
    " priority, delay, timeout, unique_key); - reads standard input. Prints their ids.",
)
def submit(queue: str | None, from_file: Any, **options: Any) -> None:
    """Queue the registered job NAME for the pools (outlast worker).

    With --from-file, every line is checked before any job is written, and they are inserted
    1,000 per transaction; an error names the line's job ("job 3: …") and writes nothing.
    """
    if from_file is None:
        _create_job(queue=queue, detach=False, **options)
        return
    given = [k for k, v in options.items() if v not in (None, (), False, "return")]
    extra = sorted(set(given) - {"name", "imports", "as_json", "store_url"})
    if queue is not None or extra:
        raise click.UsageError("with --from-file, each line gives the job's input and options")
    from outlast.run import bulk, registry

    registry.import_modules(list(options["imports"]))
    lines = bulk.read_jsonl(from_file.read())
    with _open(options["store_url"], create=True) as store:
        tasks = bulk.create_lines(store, options["name"], lines)
    ids = [t.id for t in tasks]
    if options["as_json"]:
        click.echo(render.dumps({"ids": ids, "count": len(ids)}))
    else:
        click.echo("\n".join(ids))


@cli.command()
@job_input_options
def spawn(**options: Any) -> None:
    """Run the registered job NAME in its own detached worker, now; print its id."""
    _create_job(queue=None, detach=True, **options)


@cli.command()
@click.option(
    "-c",
    "--concurrency",
    type=int,
    default=None,
    help="Jobs run at once, each in its own process [default: 1]; with --async, on one "
    "event loop [default: 100].",
)
@click.option(
    "--async",
    "use_async",
    is_flag=True,
    help="Run async def jobs on one event loop, -c of them at once (for I/O-bound jobs).",
)
@click.option(
    "--queue",
    "queues",
    multiple=True,
    metavar="Q",
    help="Claim from this queue (repeatable; default: default).",
)
@click.option(
    "--import",
    "imports",
    multiple=True,
    metavar="MODULE",
    help="Import MODULE or FILE.py at start (registers its jobs; repeatable).",
)
@click.option("--burst", is_flag=True, help="Exit once no job is pending.")
@click.option(
    "--grace",
    type=click.FloatRange(min=0),
    default=30.0,
    show_default=True,
    help="On SIGTERM, seconds running jobs get to finish before they are requeued.",
)
@store_option
def worker(
    concurrency: int | None,
    use_async: bool,
    queues: tuple[str, ...],
    imports: tuple[str, ...],
    burst: bool,
    grace: float,
    store_url: str | None,
) -> None:
    """Run a pool that claims pending jobs and runs them: -c N job processes, or with
    --async one event loop running up to -c async def jobs at once."""
    if concurrency is None:
        concurrency = 100 if use_async else 1
    if concurrency < 1:
        raise click.BadParameter(f"must be >= 1, not {concurrency}", param_hint="--concurrency")
    for queue in queues:
        _queue_name(queue)
    args = (store_url, concurrency, list(queues) or None, list(imports), burst, grace)
    if use_async:
        from outlast.run.apool import serve_async

        processed = serve_async(*args)
    else:
        from outlast.run.pool import serve_forever

        processed = serve_forever(*args)  # its job processes forked once it has imported
    click.echo(f"outlast worker: {processed} job(s) processed", err=True)


@cli.command()
@click.argument("job_id")
@click.option("--answer", metavar="JSON", help="The answer to the job's question (JSON).")
@json_option
@store_option
def resume(job_id: str, answer: str | None, as_json: bool, store_url: str | None) -> None:
    """Answer a paused job's question and queue it again."""
    parsed = parse_json(answer, "--answer")
    with _open(store_url) as store:
        from outlast.run.reap import resume as resume_job

        state = resume_job(store, job_id, parsed)
    if as_json:
        _print_job(state, True)
    else:
        click.echo(f"{job_id} resumed")


@cli.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option("--port", type=click.IntRange(0, 65535), default=8765, show_default=True)
@click.option(
    "--import",
    "imports",
    multiple=True,
    metavar="MODULE",
    help="Import MODULE first: its registered jobs can be submitted with POST /jobs.",
)
@click.option(
    "--token",
    envvar="OUTLAST_TOKEN",
    help="Bearer token required on /jobs routes "
    "($OUTLAST_TOKEN); needed to bind a non-loopback address.",
)
@store_option
def serve(
    host: str, port: int, imports: tuple[str, ...], token: str | None, store_url: str | None
) -> None:
    """Serve the HTTP API, Server-Sent Events and the dashboard."""
    from outlast.http.server import serve as serve_http

    serve_http(store_url, host, port, token, imports=imports)


@cli.command(name="mcp")
@click.option(
    "--import",
    "imports",
    multiple=True,
    metavar="MODULE",
    help="Import MODULE first: its registered jobs can be started with the submit tool.",
)
@click.option(
    "--allow-commands",
    is_flag=True,
    help="Let clients run commands (the run_command tool, and retry of command jobs): a"
    " client that may is a shell.",
)
@click.option("--http", "over_http", is_flag=True, help="Streamable HTTP at /mcp, not stdio.")
@click.option("--host", default="127.0.0.1", show_default=True, help="--http: address to bind.")
@click.option("--port", type=click.IntRange(0, 65535), default=8766, show_default=True)
@click.option(
    "--token",
    envvar="OUTLAST_TOKEN",
    help="--http: bearer token clients must send ($OUTLAST_TOKEN); needed off loopback.",
)
@store_option
def mcp(
    imports: tuple[str, ...],
    allow_commands: bool,
    over_http: bool,
    host: str,
    port: int,
    token: str | None,
    store_url: str | None,
) -> None:
    """Serve the Model Context Protocol (stdio by default): tools that mirror these verbs
    (run_command, submit, status, list_jobs, wait, logs, events, cancel, resume, retry) and
    the resources outlast://jobs/{id} and outlast://jobs/{id}/log. Needs outlast[mcp]."""
    try:
        from outlast.mcp.server import serve as serve_mcp
    except ImportError as exc:
        raise InvalidInput(
            f"outlast mcp needs the MCP SDK ({exc}): pip install 'outlast[mcp]'"
        ) from None
    serve_mcp(
        store_url,
        imports=imports,
        allow_commands=allow_commands,
        http=over_http,
        host=host,
        port=port,
        token=token,
    )


@cli.group()
def schedule() -> None:
    """Schedules: jobs made at cron times or intervals, fired by the store's maintainer
    (any running pool or `outlast serve`, or `outlast scheduler`), each fire time once.

    Exit codes: 0 done; 2 a user error (bad input, no such job, a move the job's status does
    not allow), 5 the store failed (unreachable, corrupt)."""


def _schedule_doc(store: Store, found: Any) -> dict[str, Any]:
    from outlast.run.schedules import describe

    return describe(store, found)


@schedule.command(name="add")
@click.argument("name")
@click.option("--cron", "cron_expr", metavar="EXPR", help="Five-field cron: '0 3 * * *'.")
@click.option("--every", metavar="DURATION", help="An interval instead: 30s, 10m, 1h.")
@click.option("--tz", metavar="ZONE", help="IANA time zone of --cron (default UTC).")
@click.option(
    "--misfire",
    type=click.Choice(["once", "skip"]),
    default="once",
    show_default=True,
    help="Fires missed while no process maintained the store: one catch-up run, or none.",
)
@click.option("--no-overlap", is_flag=True, help="Skip a fire while the last job is still live.")
@click.option("--job", "job_name", metavar="JOBNAME", help="A registered job instead of a command.")
@click.option("--args", "args_json", metavar="JSON", help="--job's positional arguments.")
@click.option("--kwargs", "kwargs_json", metavar="JSON", help="--job's keyword arguments.")
@click.option("--payload", "payload_json", metavar="JSON", help="A pipeline's input.")
@click.option("--import", "imports", multiple=True, metavar="MODULE", help="Where --job is.")
@click.option("--queue", help="--job's queue (default: the job's own).")
@click.option("--label", "labels", multiple=True, metavar="K=V", help="Label each job.")
@click.option("--attempts", type=click.IntRange(min=1), help="Attempts of each job.")
@click.option("--timeout", metavar="DURATION", help="Stop each attempt after this long.")
@click.option("--keep", metavar="DURATION", help="Remove each finished job after this long.")
@click.option("--priority", type=click.IntRange(-1_000_000, 1_000_000), help="Each job's priority.")
@click.option("--replace", is_flag=True, help="Update a schedule of this name.")
@json_option
@store_option
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def schedule_add(
    name: str,
    cron_expr: str | None,
    every: str | None,
    tz: str | None,
    misfire: str,
    no_overlap: bool,
    job_name: str | None,
    args_json: str | None,
    kwargs_json: str | None,
    payload_json: str | None,
    imports: tuple[str, ...],
    queue: str | None,
    labels: tuple[str, ...],
    attempts: int | None,
    timeout: str | None,
    keep: str | None,
    priority: int | None,
    replace: bool,
    as_json: bool,
    store_url: str | None,
    command: tuple[str, ...],
) -> None:
    """Add a schedule NAME that runs a command (after --) or a registered --job.

    outlast schedule add nightly --cron "0 3 * * *" --tz Europe/Berlin -- ./backup.sh
    """
    if (cron_expr is None) == (every is None):
        raise click.UsageError("give --cron EXPR or --every DURATION")
    if bool(command) == bool(job_name):
        raise click.UsageError("give a command after -- or --job JOBNAME (one of them)")
    common: dict[str, Any] = {
        "cron_expr": cron_expr,
        "every": parse_duration(every, "--every"),
        "tz": tz,
        "misfire": misfire,
        "overlap": not no_overlap,
        "labels": parse_labels(labels),
        "timeout": parse_duration(timeout, "--timeout"),
        "keep": parse_duration(keep, "--keep"),
        "replace": replace,
    }
    from outlast.run import registry, schedules

    if command:
        if args_json or kwargs_json or payload_json or queue or imports:
            raise click.UsageError("--args, --kwargs, --payload, --queue, --import go with --job")
        with _open(store_url, create=True) as store:
            made = schedules.add_command(
                store, name, list(command), attempts=attempts or 1, priority=priority or 0, **common
            )
            doc = _schedule_doc(store, made)
    else:
        assert job_name is not None
        args = parse_json(args_json, "--args") if args_json is not None else []
        kwargs = parse_json(kwargs_json, "--kwargs") if kwargs_json is not None else {}
        payload = parse_json(payload_json, "--payload")
        if not isinstance(args, list):
            raise click.BadParameter("must be a JSON list", param_hint="--args")
        if not isinstance(kwargs, dict):
            raise click.BadParameter("must be a JSON object", param_hint="--kwargs")
        if payload_json is not None and not isinstance(payload, dict):
            raise click.BadParameter("must be a JSON object", param_hint="--payload")
        if queue is not None:
            _queue_name(queue)
        registry.import_modules(list(imports))
        spec = registry.lookup(job_name)
        with _open(store_url, create=True) as store:
            made = schedules.add_job(
                store,
                spec,
                name=name,
                args=args,
                kwargs=kwargs,
                payload=payload,
                queue=queue,
                attempts=attempts,
                priority=priority,
                **common,
            )
            doc = _schedule_doc(store, made)
    if as_json:
        click.echo(render.dumps(doc))
    else:
        click.echo(f"{name}: next run at {doc['next_at']}")


@schedule.command(name="ls")
@json_option
@store_option
def schedule_ls(as_json: bool, store_url: str | None) -> None:
    """List schedules: when they fire next, and their last job and its status."""
    with _open(store_url) as store:
        docs = [_schedule_doc(store, s) for s in store.schedules()]
    click.echo(render.dumps({"schedules": docs}) if as_json else render.schedules_table(docs))


@schedule.command(name="show")
@click.argument("name")
@json_option
@store_option
def schedule_show(name: str, as_json: bool, store_url: str | None) -> None:
    """Show one schedule and its next five fire times."""
    from outlast import cron
    from outlast.model import utcnow

    with _open(store_url) as store:
        found = store.get_schedule(name)
        doc = _schedule_doc(store, found)
    if as_json:
        click.echo(render.dumps(doc))
        return
    click.echo(render.schedules_table([doc]))
    if not found.paused:
        for at in cron.upcoming(found, 5, (found.next_at or utcnow()) - _TICK):
            click.echo(f"  next: {at.isoformat()}")


@schedule.command(name="rm")
@click.argument("names", nargs=-1, required=True, metavar="NAME...")
@store_option
def schedule_rm(names: tuple[str, ...], store_url: str | None) -> None:
    """Remove schedules (the jobs they made stay)."""
    from outlast.run import schedules

    with _open(store_url) as store:
        for name in names:
            schedules.remove(store, name)
            click.echo(f"{name} removed")


@schedule.command(name="pause")
@click.argument("name")
@json_option
@store_option
def schedule_pause(name: str, as_json: bool, store_url: str | None) -> None:
    """Stop firing a schedule until it is resumed."""
    with _open(store_url) as store:
        doc = _schedule_doc(store, store.pause_schedule(name))
    click.echo(render.dumps(doc) if as_json else f"{name} paused")


@schedule.command(name="resume")
@click.argument("name")
@json_option
@store_option
def schedule_resume(name: str, as_json: bool, store_url: str | None) -> None:
    """Fire a paused schedule again, from its next fire time after now."""
    with _open(store_url) as store:
        doc = _schedule_doc(store, store.pause_schedule(name, paused=False))
    click.echo(render.dumps(doc) if as_json else f"{name} resumed: next run at {doc['next_at']}")


@schedule.command(name="run-now")
@click.argument("name")
@json_option
@store_option
def schedule_run_now(name: str, as_json: bool, store_url: str | None) -> None:
    """Make one job of the schedule now (its fire times stay as they are); print its id."""
    from outlast.run import schedules

    with _open(store_url) as store:
        job = schedules.run_now(store, name)
    if as_json:
        _print_job(job, True)
    else:
        click.echo(job.id)


@cli.group()
def group() -> None:
    """Concurrency keys: pueue-style groups of commands (outlast run --group NAME) and the
    limit keys of function jobs. A key's slots are how many of its jobs run at once.

    Exit codes: 0 done; 2 a user error (bad input, no such job, a move the job's status does
    not allow), 5 the store failed (unreachable, corrupt)."""


@group.command(name="set")
@click.argument("name")
@click.option("--slots", type=click.IntRange(1, 100_000), help="Jobs of NAME running at once.")
@click.option("--unset", is_flag=True, help="Forget NAME's slots (each job's own limit, else 1).")
@store_option
def group_set(name: str, slots: int | None, unset: bool, store_url: str | None) -> None:
    """Set how many jobs of the group (or limit key) NAME run at once."""
    if (slots is None) == (not unset):
        raise click.UsageError("give --slots N or --unset")
    from outlast.run.api import set_slots

    with _open(store_url, create=True) as store:
        set_slots(name, None if unset else slots, store)
    click.echo(f"{name}: {'slots unset' if unset else f'{slots} slot(s)'}")


@group.command(name="ls")
@json_option
@store_option
def group_ls(as_json: bool, store_url: str | None) -> None:
    """Groups and limit keys: their slots, the jobs running now, and the command and spawned
    jobs waiting to start (parked for a slot, or delayed)."""
    with _open(store_url) as store:
        docs = store.groups()
    if as_json:
        click.echo(render.dumps({"groups": docs}))
        return
    if not docs:
        click.echo("no groups")
        return
    width = max(4, *(len(str(d["name"])) for d in docs))
    click.echo(f"{'NAME':<{width}}  SLOTS  RUNNING  WAITING")
    for d in docs:
        slots = "-" if d["slots"] is None else str(d["slots"])
        click.echo(f"{d['name']:<{width}}  {slots:<5}  {d['running']:<7}  {d['waiting']}")


@cli.command()
@click.option(
    "--import",
    "imports",
    multiple=True,
    metavar="MODULE",
    help="Import MODULE first: its @outlast.job(cron=…) schedules are stored.",
)
@store_option
def scheduler(imports: tuple[str, ...], store_url: str | None) -> None:
    """Maintain the store in the foreground, and nothing else: fire schedules, reconcile the
    jobs of dead workers, apply retention. Any pool or `outlast serve` does this already;
    run this where neither runs. Several may run: one at a time is the maintainer."""
    from outlast.run.maintain import run_maintainer

    run_maintainer(store_url, list(imports))


def run_cli(argv: list[str], quick_exit: bool = False) -> None:
    """Run the click CLI on ``argv``; exits the process (``Cli.main`` maps every error).
    ``quick_exit`` (the console script): a read-only verb ends the process with
    ``os._exit`` once its output is flushed, rather than raising ``SystemExit``."""
    cli.quick_exit = quick_exit
    cli.main(args=argv, prog_name="outlast")
