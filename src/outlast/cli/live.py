"""``outlast watch``: a live view of one job until it ends.

On a terminal, a rich progress display (the job's step, status and progress, with the latest
events beneath); elsewhere plain lines, one per event, so logs and pipes stay readable.
"""

from __future__ import annotations

import click

from outlast.cli import render
from outlast.model import JobState
from outlast.run.reap import follow
from outlast.store import Store


def watch(store: Store, job_id: str, fancy: bool) -> JobState:
    if not fancy:
        return _plain(store, job_id)
    return _rich(store, job_id)


def _plain(store: Store, job_id: str) -> JobState:
    state = store.get(job_id)
    for update in follow(store, job_id):
        state, events = update
        for event in events:
            click.echo(render.event_line(event.to_dict()))
    click.echo(f"{job_id} {state.status}")
    return state


def _rich(store: Store, job_id: str) -> JobState:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console()
    progress = Progress(
        TextColumn("[bold]{task.fields[name]}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TextColumn("{task.fields[status]}"),
        TextColumn("[dim]{task.fields[step]}"),
        TimeElapsedColumn(),
        console=console,
    )
    state = store.get(job_id)
    with progress:
        bar = progress.add_task("", total=100, name=state.name, status="", step="")
        for update in follow(store, job_id):
            state, events = update
            for event in events:
                progress.console.print(render.event_line(event.to_dict()), highlight=False)
            known = state.progress is not None
            progress.update(
                bar,
                completed=state.progress or 0,
                total=100 if known or state.terminal else None,
                status=str(state.status),
                step=state.step or "",
            )
    style = {"succeeded": "green", "failed": "red", "canceled": "yellow"}.get(state.status, "")
    console.print(f"[{style}]{job_id} {state.status}[/]" if style else f"{job_id} {state.status}")
    if state.error:
        console.print(f"[red]{state.error.code}: {state.error.message}[/]", highlight=False)
    return state
