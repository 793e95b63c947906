"""A reader that goes away (``outlast ls | head -1``) ends the command quietly; any other
broken pipe (one of outlast's own, say to a process it started) is not hidden: it is an
error with its traceback, never a silent exit 0."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.cli.helpers import OUTLAST, TIMEOUT, Outlast

BOOM = """
import sys

from outlast.cli.app import cli, run_cli


@cli.command("boom")
def boom() -> None:
    import socket

    a, b = socket.socketpair()
    b.close()
    a.sendall(b"x")  # a pipe of this process's own, its other end gone: BrokenPipeError


run_cli(sys.argv[1:])
"""


def _run_into_closed_pipe(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` with its stdout a pipe whose reader has already gone."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run(
            argv, stdout=write, stderr=subprocess.PIPE, env=env, text=True, timeout=TIMEOUT
        )
    finally:
        os.close(write)


def test_a_reader_that_goes_away_ends_the_command_quietly(cli: Outlast) -> None:
    job_id = cli("run", "--", "true").ok().out.strip()
    cli("wait", job_id).ok()
    for argv in (["ls"], ["ls", "--json"], ["status", job_id], ["status", "--json", job_id]):
        done = _run_into_closed_pipe([OUTLAST, *argv], cli.env)
        assert (done.returncode, done.stderr) == (0, ""), (argv, done)


def test_a_broken_pipe_of_outlasts_own_is_an_error(cli: Outlast) -> None:
    done = subprocess.run(
        [sys.executable, "-c", BOOM, "boom"],
        capture_output=True,
        env=cli.env,
        text=True,
        timeout=TIMEOUT,
    )
    assert done.returncode != 0, done
    assert "BrokenPipeError" in done.stderr, done
