"""``GET /metrics``: the store's numbers (:mod:`outlast.store.stats`) in Prometheus' text
format, built with ``prometheus_client`` at each scrape.

Everything is read from the store, so one server's ``/metrics`` is right for every pool on
every host that shares the store; nothing is counted in this process. Hence the shape:
gauges of what the store holds now (jobs by queue, status and kind; the oldest due job per
queue; busy workers; schedules), and, for the jobs that finished in the last window
(``outlast_window_seconds``, one hour), their number by kind and outcome and histograms of
their wait (from creation to their last start) and run times (of the most recent
``RECENT_MAX``: a sample that keeps a scrape cheap at any throughput). These are snapshots of a
sliding window, not counters: read them as they are (``histogram_quantile`` works; ``rate``
does not).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric

from outlast.store.stats import RECENT_MAX, Stats

__all__ = ["CONTENT_TYPE_LATEST", "render"]

#: Histogram buckets of wait and run times, seconds.
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)


def render(stats: Stats) -> bytes:
    """The metrics of ``stats`` in Prometheus' text format."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Snapshot(stats))
    return generate_latest(registry)


class _Snapshot:
    def __init__(self, stats: Stats) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        s = self.stats
        jobs = GaugeMetricFamily(
            "outlast_jobs",
            "Jobs in the store by queue, status and kind.",
            labels=["queue", "status", "kind"],
        )
        for (queue, status, kind), n in sorted(s.jobs.items()):
            jobs.add_metric([queue, status, kind], n)
        yield jobs
        oldest = GaugeMetricFamily(
            "outlast_queue_oldest_due_seconds",
            "Seconds the longest-waiting due pending job of the queue has waited.",
            labels=["queue"],
        )
        for queue in sorted({q for q, _, _ in s.jobs}):
            oldest.add_metric([queue], round(s.oldest_due.get(queue, 0.0), 6))
        yield oldest
        yield GaugeMetricFamily(
            "outlast_window_seconds", "The window of the outlast_recent_* metrics.", s.window
        )
        finished = GaugeMetricFamily(
            "outlast_recent_jobs_finished",
            "Jobs that finished in the window, by kind and outcome.",
            labels=["kind", "status"],
        )
        for (kind, status), n in sorted(s.finished.items()):
            finished.add_metric([kind, status], n)
        yield finished
        yield _histogram(
            "outlast_recent_wait_seconds",
            "Time the jobs that finished in the window waited, from creation to their last"
            f" start (the most recent {RECENT_MAX:,} of them).",
            [w for _, _, w, _ in s.recent],
        )
        yield _histogram(
            "outlast_recent_run_seconds",
            "Time the jobs that finished in the window ran, their last attempt (the most"
            f" recent {RECENT_MAX:,} of them).",
            [r for _, _, _, r in s.recent],
        )
        yield GaugeMetricFamily(
            "outlast_workers_busy", "Distinct workers running jobs now.", s.busy_workers
        )
        workers = GaugeMetricFamily(
            "outlast_workers", "Live workers of the registry, by kind.", labels=["kind"]
        )
        for kind, n in sorted(s.workers.items()):
            workers.add_metric([kind], n)
        yield workers
        schedules = GaugeMetricFamily("outlast_schedules", "Schedules by state.", labels=["state"])
        schedules.add_metric(["total"], s.schedules)
        schedules.add_metric(["paused"], s.schedules_paused)
        schedules.add_metric(["due"], s.schedules_due)
        yield schedules


def _histogram(name: str, documentation: str, values: list[float]) -> Any:
    buckets = []
    for bound in BUCKETS:
        buckets.append((str(bound), sum(1 for v in values if v <= bound)))
    buckets.append(("+Inf", len(values)))
    return HistogramMetricFamily(name, documentation, buckets=buckets, sum_value=sum(values))
