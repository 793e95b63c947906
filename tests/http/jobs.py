"""Job functions the test server registers, so ``POST /jobs`` has names to accept."""

from __future__ import annotations

import outlast


@outlast.job(name="tests.add")
def add(a: int, b: int) -> int:
    return a + b


@outlast.job(name="tests.echo", queue="http-tests")
def echo(*args: object, **kwargs: object) -> dict[str, object]:
    return {"args": list(args), "kwargs": kwargs}
