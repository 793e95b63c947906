"""The ``outlast`` command. ``main`` tries the light fast path first (``status``), then click."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if "status" in args[:4]:  # the verb, maybe after --json / --store URL
        from outlast.cli.fast import status

        try:
            code = status(args)
            if code is not None:
                sys.stdout.flush()
        except BrokenPipeError:  # `outlast status ID | head -c 1` (it writes only there)
            quiet_stdout()
            code = 0
        if code is not None:
            sys.exit(code)
    from outlast.cli.app import run_cli

    run_cli(args, quick_exit=argv is None)


def reader_gone() -> bool:
    """Whether standard output is a pipe (or socket) whose reader went away: the one broken
    pipe a command ends on quietly, with exit 0 (``outlast ls | head -1``). Any other is a
    pipe of outlast's own, and an error."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        events = poller.poll(0)
    except (AttributeError, ValueError, OSError):  # no standard output to speak of
        return False
    return any(event & (select.POLLERR | select.POLLHUP) for _, event in events)


def quiet_stdout() -> None:
    """Point standard output at /dev/null once its reader went away: what is still buffered
    is dropped at exit instead of failing again there (Python's own advice)."""
    import contextlib
    import os

    with contextlib.suppress(AttributeError, ValueError, OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
