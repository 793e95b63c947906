"""The ``outlast`` command line (click). Parses input, calls the store and run layers, prints.

Every verb takes ``--store URL`` (default ``$OUTLAST_STORE``, else SQLite in the user's state
directory) and most take ``--json``, which prints the job document of DESIGN.md. Errors print
one line, ``outlast: error: …``, on stderr: a user error exits 2 and writes nothing; a store
that fails (unreachable, corrupt) exits 5.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from outlast.cli import render
from outlast.errors import CorruptJob, InvalidInput, OutlastError, StoreError
from outlast.model import EventStatus, JobState, Status
from outlast.store import Store, open_store

F = TypeVar("F", bound=Callable[..., Any])

#: Exit codes: a job failed, a user error (bad input, no such job, a move the status machine
#: does not allow), a canceled job, the store failed (unreachable, corrupt), timed out.
EXIT_FAILED, EXIT_USAGE, EXIT_CANCELED, EXIT_STORE, EXIT_TIMEOUT = 1, 2, 3, 5, 124


def store_option(fn: F) -> F:
    return click.option(
        "--store",
        "store_url",
        metavar="URL",
        envvar="OUTLAST_STORE",
        help="Store URL (sqlite:///abs.db, files:///abs/dir, postgresql://…); $OUTLAST_STORE.",
    )(fn)


def json_option(fn: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON (the job document).")(
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


def parse_json(text: str | None, what: str) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise click.BadParameter(f"not valid JSON ({exc})", param_hint=what) from None


def parse_duration(text: str) -> float:
    """Seconds in ``90s``, ``15m``, ``12h``, ``7d`` or a bare number of seconds."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    number, unit = (text[:-1], text[-1]) if text and text[-1] in units else (text, "s")
    try:
        value = float(number)
    except ValueError:
        raise click.BadParameter(
            f"a duration is like 90s, 15m, 12h or 7d, not {text!r}", param_hint="--older-than"
        ) from None
    if not value >= 0 or value == float("inf"):
        raise click.BadParameter(f"must be >= 0, not {text!r}", param_hint="--older-than")
    return value * units[unit]


def _one_line(message: str) -> str:
    """A driver's several-line message (libpq's hints) as one line."""
    return "; ".join(part.strip() for part in message.splitlines() if part.strip())


class Cli(click.Group):
    """Turns outlast's errors and click's usage errors into one line on stderr: exit 2 for a
    user's error, 5 when the store failed."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["standalone_mode"] = False
        try:
            code = super().main(*args, **kwargs)
        except click.exceptions.Exit as exc:
            sys.exit(exc.exit_code)
        except click.Abort:
            click.echo("outlast: aborted", err=True)
            sys.exit(130)
        except click.UsageError as exc:
            click.echo(f"outlast: error: {exc.format_message()}", err=True)
            sys.exit(EXIT_USAGE)
        except click.ClickException as exc:
            click.echo(f"outlast: error: {exc.format_message()}", err=True)
            sys.exit(exc.exit_code)
        except (StoreError, CorruptJob) as exc:
            click.echo(f"outlast: error: {_one_line(str(exc))}", err=True)
            sys.exit(EXIT_STORE)
        except OutlastError as exc:
            click.echo(f"outlast: error: {_one_line(str(exc))}", err=True)
            sys.exit(EXIT_USAGE)
        except KeyboardInterrupt:
            sys.exit(130)
        except BrokenPipeError:
            sys.exit(0)
        sys.exit(code if isinstance(code, int) else 0)


@click.group(cls=Cli, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="outlast")
def cli() -> None:
    """outlast: background jobs that outlast the process that started them."""


@cli.command(context_settings={"allow_interspersed_args": False})
@click.option("--name", help="A name for the job (default: the command).")
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
@json_option
@store_option
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def run(
    name: str | None,
    labels: tuple[str, ...],
    attempts: int,
    grace: float,
    as_json: bool,
    store_url: str | None,
    command: tuple[str, ...],
) -> None:
    """Run COMMAND as a detached job and print its id at once.

    Use -- before the command: outlast run --name build -- make -j4
    """
    if not command:
        raise click.UsageError("no command given: outlast run [OPTIONS] -- COMMAND [ARGS]...")
    parsed = parse_labels(labels)
    from outlast.run.api import run_command

    with _open(store_url, create=True) as store:
        task = run_command(
            list(command),
            name=name,
            labels=parsed,
            attempts=attempts,
            grace=grace,
            store=store,
        )
        if as_json:
            _print_job(task.state(), True)
        else:
            click.echo(task.id)


@cli.command()
@click.argument("job_id")
@json_option
@store_option
def status(job_id: str, as_json: bool, store_url: str | None) -> None:
    """Show one job (reconciling it first if its worker died)."""
    from outlast.run.reap import reconcile

    with _open(store_url) as store:
        _print_job(reconcile(store, store.get(job_id)), as_json)


@cli.command(name="ls")
@click.option("--status", "status_", type=click.Choice([s.value for s in Status]))
@click.option("--label", metavar="K=V", help="Only jobs with this label.")
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True)
@click.option("--before", metavar="ID", help="Page: jobs older than this one.")
@json_option
@store_option
def ls(
    status_: str | None,
    label: str | None,
    limit: int,
    before: str | None,
    as_json: bool,
    store_url: str | None,
) -> None:
    """List jobs, newest first."""
    from outlast.run.reap import reconcile

    if label is not None:
        parse_labels((label,))
    with _open(store_url) as store:
        states = [
            s if s.terminal else reconcile(store, s)
            for s in store.list(status=status_, label=label, limit=limit, before=before)
        ]
    docs = [s.to_dict() for s in states]
    click.echo(render.dumps(docs) if as_json else render.jobs_table(docs))


@cli.command()
@click.argument("job_id")
@click.option("--timeout", type=click.FloatRange(min=0), help="Give up after S seconds (exit 124).")
@json_option
@store_option
def wait(job_id: str, timeout: float | None, as_json: bool, store_url: str | None) -> None:
    """Wait for a job to finish. Exit 0 succeeded, 1 failed, 3 canceled, 124 timed out."""
    from outlast.run.reap import wait_for

    with _open(store_url) as store:
        state = wait_for(store, job_id, timeout)
    if as_json:
        _print_job(state, True)
    codes = {Status.SUCCEEDED: 0, Status.FAILED: EXIT_FAILED, Status.CANCELED: EXIT_CANCELED}
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
@store_option
def logs(job_id: str, follow: bool, store_url: str | None) -> None:
    """Print a job's output (stdout and stderr, interleaved)."""
    from outlast.run import logs as joblogs
    from outlast.run.reap import reconcile

    with _open(store_url) as store:
        store.get(job_id)  # unknown id: a clear error
        path = store.log_path(job_id)
        if not follow:
            joblogs.write_stdout(joblogs.read_log(path))
            return
        with store.listen([job_id]) as listener:
            joblogs.follow(
                path,
                joblogs.write_stdout,
                lambda: reconcile(store, store.get(job_id)).terminal,
                listener.fileno(),
                listener.drain,
            )


@cli.command()
@click.argument("job_id")
@json_option
@store_option
def cancel(job_id: str, as_json: bool, store_url: str | None) -> None:
    """Cancel a job: its worker gets SIGTERM, then SIGKILL after the grace period."""
    from outlast.run.reap import cancel as cancel_job

    with _open(store_url) as store:
        before, after = cancel_job(store, job_id)
    if as_json:
        _print_job(after, True)
    elif before.terminal:
        click.echo(f"{job_id} had already {before.status}; nothing to cancel")
    elif not after.terminal:
        click.echo(f"{job_id} cancel requested: its cleanup stages run first")
    else:
        click.echo(f"{job_id} canceled")


@cli.command(name="rm")
@click.argument("job_ids", nargs=-1, required=True, metavar="ID...")
@click.option("--force", is_flag=True, help="Cancel and remove a job that is still live.")
@store_option
def rm(job_ids: tuple[str, ...], force: bool, store_url: str | None) -> None:
    """Remove finished jobs, with their events and logs."""
    from outlast.run.reap import cancel as cancel_job

    with _open(store_url) as store:
        for job_id in job_ids:
            state = store.get(job_id)
            if force and not state.terminal:
                cancel_job(store, job_id)
            store.delete(job_id, force=force)
            click.echo(f"{job_id} removed")


@cli.command()
@click.option(
    "--older-than",
    "older_than",
    required=True,
    metavar="DURATION",
    help="Age since the job finished: 90s, 15m, 12h, 7d.",
)
@click.option("--dry-run", is_flag=True, help="Only list what would be removed.")
@store_option
def prune(older_than: str, dry_run: bool, store_url: str | None) -> None:
    """Remove finished jobs (succeeded, failed, canceled) older than DURATION."""
    from datetime import timedelta

    from outlast.model import TERMINAL, utcnow

    cutoff = utcnow() - timedelta(seconds=parse_duration(older_than))
    removed = 0
    with _open(store_url) as store:
        for status_ in TERMINAL:
            for state in store.list(status=status_, limit=None):
                if (state.finished_at or state.updated_at) < cutoff:
                    if not dry_run:
                        store.delete(state.id)
                    removed += 1
    click.echo(f"{'would remove' if dry_run else 'removed'} {removed} job(s)")


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
                "--import",
                "imports",
                multiple=True,
                metavar="MODULE",
                help="Import MODULE first (where the job is registered).",
            ),
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
    with _open(store_url, create=True) as store:
        if detach:
            task = spawn_job(store, spec, args, kwargs, labels=parsed_labels, payload=payload)
        else:
            task = create_job(
                store, spec, args, kwargs, queue=queue, labels=parsed_labels, payload=payload
            )
        if as_json:
            _print_job(task.state(), True)
        else:
            click.echo(task.id)


@cli.command()
@job_input_options
@click.option("--queue", help="Queue (default: the job's own).")
def submit(queue: str | None, **options: Any) -> None:
    """Queue the registered job NAME for the pools (outlast worker)."""
    _create_job(queue=queue, detach=False, **options)


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
    default=1,
    show_default=True,
    help="Jobs run at once, each in its own process.",
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
    help="Import MODULE at start (registers its jobs; repeatable).",
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
    concurrency: int,
    queues: tuple[str, ...],
    imports: tuple[str, ...],
    burst: bool,
    grace: float,
    store_url: str | None,
) -> None:
    """Run a pool that claims pending jobs and runs them."""
    if concurrency < 1:
        raise click.BadParameter(f"must be >= 1, not {concurrency}", param_hint="--concurrency")
    for queue in queues:
        _queue_name(queue)
    from outlast.run.pool import serve_forever

    processed = serve_forever(
        store_url, concurrency, list(queues) or None, list(imports), burst, grace
    )
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


def run_cli(argv: list[str]) -> None:
    """Run the click CLI on ``argv``; exits the process (``Cli.main`` maps every error)."""
    cli.main(args=argv, prog_name="outlast")
