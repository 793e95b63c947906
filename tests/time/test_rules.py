"""The pure rules of time: durations and times as people write them, cron fire times in a
time zone across daylight saving changes, and what a due schedule fires (misfires, overlap)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from outlast import cron
from outlast.errors import InvalidInput
from outlast.model import Kind, Schedule
from outlast.when import due_time, format_duration, parse_duration, parse_time

BERLIN = ZoneInfo("Europe/Berlin")
T0 = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90s", 90),
        ("15m", 900),
        ("12h", 43200),
        ("7d", 604800),
        ("2w", 1209600),
        ("1h30m", 5400),
        ("250ms", 0.25),
        (" 2 h ", 7200),
        ("90", 90),
        ("1.5", 1.5),
        (45, 45),
        (timedelta(minutes=2), 120),
    ],
)
def test_durations(text: object, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("10 parsecs", "'10 parsecs'"),
        ("-5s", ">= 0"),
        (-1, ">= 0"),
        ("", "like 90s"),
        ("nan", "nan"),
        ("inf", "inf"),
        ("200y", "'200y'"),
        ("99999w", "100 years"),
        (True, "True"),
        (None, "None"),
    ],
)
def test_bad_durations_say_what_is_wrong(text: object, says: str) -> None:
    with pytest.raises(InvalidInput, match=None) as caught:
        parse_duration(text, "delay")
    assert says in str(caught.value) and "delay" in str(caught.value)


def test_times_need_a_zone_and_a_past_time_runs_now() -> None:
    assert parse_time("2026-12-24T03:00Z") == datetime(2026, 12, 24, 3, tzinfo=UTC)
    assert parse_time("2026-12-24T04:00+01:00") == datetime(2026, 12, 24, 3, tzinfo=UTC)
    with pytest.raises(InvalidInput, match="no time zone"):
        parse_time("2026-12-24T03:00")
    with pytest.raises(InvalidInput, match="ISO 8601"):
        parse_time("tomorrow")
    now = datetime(2026, 6, 1, tzinfo=UTC)
    assert due_time(at="2020-01-01T00:00Z", now=now) == (None, True)
    assert due_time(delay="10m", now=now) == (now + timedelta(minutes=10), False)
    assert due_time(delay=0, now=now) == (None, False)
    with pytest.raises(InvalidInput, match="not both"):
        due_time(delay=1, at="2026-12-24T03:00Z")


def test_format_duration() -> None:
    assert [format_duration(s) for s in (5, 45, 90, 9000, 300000)] == [
        "5s",
        "45s",
        "1m",
        "2h30m",
        "3d11h",
    ]


def _schedule(**kw: object) -> Schedule:
    template = cron.template(Kind.COMMAND, "t", command=["true"])
    return cron.new_schedule("s", template, **kw)  # type: ignore[arg-type]


def test_dst_a_skipped_wall_time_fires_once_at_the_same_instant_an_hour_on() -> None:
    """2026-03-29, Europe/Berlin: clocks go 02:00 -> 03:00, so 02:30 does not exist: it
    fires at 01:30 UTC (03:30 summer time), once; the days around it at 02:30 local."""
    s = _schedule(cron="30 2 * * *", tz="Europe/Berlin", now=datetime(2026, 3, 27, 12, tzinfo=UTC))
    times = cron.upcoming(s, 3, datetime(2026, 3, 27, 12, tzinfo=UTC))
    assert times == [
        datetime(2026, 3, 28, 1, 30, tzinfo=UTC),  # 02:30 CET
        datetime(2026, 3, 29, 1, 30, tzinfo=UTC),  # the skipped 02:30: 03:30 CEST
        datetime(2026, 3, 30, 0, 30, tzinfo=UTC),  # 02:30 CEST
    ]
    assert [t.astimezone(BERLIN).hour for t in times] == [2, 3, 2]


def test_dst_a_repeated_wall_time_fires_once_the_first_time() -> None:
    """2026-10-25, Europe/Berlin: clocks go 03:00 -> 02:00, so 02:30 happens twice: it
    fires at the first (00:30 UTC), not again an hour later."""
    start = datetime(2026, 10, 24, 12, tzinfo=UTC)
    s = _schedule(cron="30 2 * * *", tz="Europe/Berlin", now=start)
    times = cron.upcoming(s, 3, start)
    assert times == [
        datetime(2026, 10, 25, 0, 30, tzinfo=UTC),  # 02:30 CEST, the first 02:30
        datetime(2026, 10, 26, 1, 30, tzinfo=UTC),  # 02:30 CET
        datetime(2026, 10, 27, 1, 30, tzinfo=UTC),
    ]
    # asked from inside the repeated hour (the second 02:10), the next is the next day's
    inside = datetime(2026, 10, 25, 1, 10, tzinfo=UTC)
    assert cron.next_fire(s, inside) == datetime(2026, 10, 26, 1, 30, tzinfo=UTC)


def test_every_fires_at_whole_multiples() -> None:
    s = _schedule(every=10, now=T0)
    assert s.next_at == T0 + timedelta(seconds=10)
    assert cron.next_fire(s, T0 + timedelta(seconds=25)) == T0 + timedelta(seconds=30)
    assert cron.latest_fire(s, T0 + timedelta(seconds=25)) == T0 + timedelta(seconds=20)


def test_a_fire_on_time_makes_one_job_keyed_by_its_fire_time() -> None:
    s = _schedule(every=1, now=T0)
    due = s.next_at
    assert due is not None
    new, fires = cron.plan(s, due + timedelta(milliseconds=300), last_live=False)
    assert [f.reason for f in fires] == ["on_time"] and fires[0].fire_at == due
    assert new.next_at == due + timedelta(seconds=1) and new.fires == 1
    assert new.last_job == cron.job_id("s", due) == "s.20260101T000001Z"
    job = cron.make_job(s, fires[0], due)
    assert job.id == "s.20260101T000001Z" and job.fired == fires[0]
    assert cron.plan(new, due + timedelta(milliseconds=300), False)[1] == []  # not due again


@pytest.mark.parametrize(("policy", "reasons"), [("once", ["catch_up"]), ("skip", [])])
def test_missed_fires_make_one_catch_up_or_none(policy: str, reasons: list[str]) -> None:
    s = _schedule(every=1, now=T0, misfire=policy)
    assert s.next_at is not None
    now = s.next_at + timedelta(seconds=4.5)  # five fire times came with nobody to fire them
    new, fires = cron.plan(s, now, last_live=False)
    assert [f.reason for f in fires] == reasons
    if fires:  # the catch-up is for the latest missed fire time
        assert fires[0].fire_at == s.next_at + timedelta(seconds=4)
    assert new.next_at == s.next_at + timedelta(seconds=5)
    assert new.skipped == 1  # the missed fire times made no job of their own


def test_a_lone_fire_more_than_a_minute_late_is_a_misfire() -> None:
    s = _schedule(cron="0 3 * * *", now=T0, misfire="skip")
    assert s.next_at is not None
    assert cron.plan(s, s.next_at + timedelta(seconds=59), False)[1] != []
    assert cron.plan(s, s.next_at + timedelta(hours=5), False)[1] == []


def test_no_overlap_skips_while_the_last_job_is_live() -> None:
    s = _schedule(every=1, now=T0, overlap=False)
    assert s.next_at is not None
    new, fires = cron.plan(s, s.next_at, last_live=True)
    assert fires == [] and new.skipped == 1 and new.next_at == s.next_at + timedelta(seconds=1)
    assert cron.plan(s, s.next_at, last_live=False)[1] != []


def test_a_paused_schedule_does_not_fire() -> None:
    s = _schedule(every=1, now=T0, paused=True)
    assert s.next_at is not None
    assert cron.plan(s, s.next_at + timedelta(seconds=3), False) == (s, [])


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"cron": "61 * * * *"}, "invalid cron expression '61 * * * *'"),
        ({"cron": "* * *"}, "has 3 fields"),
        ({"cron": "0 3 * * *", "tz": "Mars/Olympus"}, "unknown time zone 'Mars/Olympus'"),
        ({"cron": "0 3 * * *", "tz": "../etc/passwd"}, "unknown time zone"),
        ({"every": 0.5}, "at least 1 second"),
        ({}, "either a cron expression or an interval"),
        ({"cron": "0 3 * * *", "every": 5}, "either a cron expression or an interval"),
        ({"every": 5, "tz": "Europe/Berlin"}, "applies to cron"),
        ({"every": 5, "misfire": "later"}, "'once' or 'skip'"),
    ],
)
def test_bad_schedules_say_what_is_wrong(options: dict[str, object], says: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        _schedule(**options)
    assert says in str(caught.value)


def test_schedules_read_back_exactly() -> None:
    s = _schedule(cron="*/5 * * * *", tz="Europe/Berlin", now=T0, overlap=False)
    assert Schedule.from_dict(s.to_dict()) == s
