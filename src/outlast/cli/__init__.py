"""The ``outlast`` command. ``main`` tries the light fast path first (``status``), then click."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if "status" in args[:4]:  # the verb, maybe after --json / --store URL
        from outlast.cli.fast import status

        code = status(args)
        if code is not None:
            sys.exit(code)
    from outlast.cli.app import run_cli

    run_cli(args, quick_exit=argv is None)
