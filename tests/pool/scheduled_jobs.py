"""Jobs that declare schedules, for the tests of ``@outlast.job(cron=…)`` (a module of their
own: a pool that imports it stores its schedules)."""

from __future__ import annotations

import outlast

MODULE = __name__


@outlast.job(name="pt.nightly", cron="30 2 * * *", tz="Europe/Berlin", misfire="skip")
def nightly() -> str:
    return "nightly"


@outlast.job(name="pt.tick", every="1s", overlap=False)
def tick() -> str:
    return "tick"
