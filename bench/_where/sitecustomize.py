"""Loads the probe of ``bench/where_bench.py`` (``_where_probe``) into every Python process
started with this folder on ``PYTHONPATH`` and ``WHERE_OUT`` set; does nothing otherwise."""

import os

if os.environ.get("WHERE_OUT"):
    import _where_probe

    _where_probe.boot()
