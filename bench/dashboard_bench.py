"""The dashboard's first paint with 10,000 jobs in the store (``--jobs``): a real server
(``create_app`` under uvicorn) and headless Chromium (Debian's, through Playwright), the page
loaded cold ``--runs`` times; the time from navigation to the first job row shown, and to the
pager (the list is paged: 50 jobs a page, newest first, a cursor for the next). Then the same
with a search in the address (``#/?q=…``, what the search box writes): a name a quarter of
the jobs have (``resize``), one of a thousand (``invoice``), one none has, and an id prefix;
and what ``Store.list`` itself costs for each filter (median of 15).

    .venv/bin/python bench/dashboard_bench.py [--jobs 10000] [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = Path(HERE).parent
sys.path.insert(0, str(ROOT))

from metrics_bench import fill  # noqa: E402
from tests.http.harness import Server  # noqa: E402

from outlast.store import Store, open_store  # noqa: E402

CHROMIUM = "/usr/bin/chromium"


def first_paints(browser: Any, url: str, runs: int, wait: str) -> list[float]:
    """Seconds from navigation to ``wait`` shown, one cold page (a new context) a run."""
    times = []
    for _ in range(runs):
        page = browser.new_context(viewport={"width": 1360, "height": 860}).new_page()
        t0 = time.perf_counter()
        page.goto(url)
        page.locator(wait).first.wait_for()
        times.append(time.perf_counter() - t0)
        page.context.close()
    return times


def list_costs(store: Store, searches: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Median milliseconds of ``Store.list(limit=50, **filters)`` per search."""
    out = {}
    for label, filters in searches.items():
        times = []
        for _ in range(15):
            t0 = time.perf_counter()
            store.list(limit=50, **filters)
            times.append(time.perf_counter() - t0)
        out[label] = statistics.median(times) * 1000
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=5)
    opts = parser.parse_args()
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o700)
        url = f"sqlite://{tmp}/s.db"
        store = open_store(url)
        fill(store, opts.jobs)
        prefix = store.list(limit=1)[0].id[:14]
        searches = {
            "no search": {},
            "name resize (1 in 4)": {"name": "resize"},
            "name invoice (1 in 1,000)": {"name": "invoice"},
            "name nosuchname (none)": {"name": "nosuchname"},
            f"id prefix {prefix}": {"id_prefix": prefix},
            "failed, name resize": {"status": "failed", "name": "resize"},
        }
        pages = {
            "no search": ("", "#jobs tr"),
            "name resize (1 in 4)": ("#/?q=resize", "#jobs tr"),
            "name invoice (1 in 1,000)": ("#/?q=invoice", "#jobs tr"),
            "name nosuchname (none)": ("#/?q=nosuchname", "#no-match:not([hidden])"),
            f"id prefix {prefix}": (f"#/?q=id:{prefix}", "#jobs tr"),
        }
        server = Server(url, Path(tmp))
        paints: dict[str, list[float]] = {}
        try:
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(
                    executable_path=CHROMIUM,
                    headless=True,
                    args=["--no-sandbox", "--disable-background-networking", "--disable-gpu"],
                )
                pager = first_paints(browser, f"{server.url}/", opts.runs, "#pager:not([hidden])")
                for label, (hash_, wait) in pages.items():
                    paints[label] = first_paints(browser, f"{server.url}/{hash_}", opts.runs, wait)
                browser.close()
        finally:
            server.close()
        costs = list_costs(store, searches)
        store.close()
    print(f"dashboard at {opts.jobs:,} jobs, {opts.runs} cold loads each (p50, min):")
    for label, times in paints.items():
        print(
            f"  first paint, {label}: {statistics.median(times) * 1000:.0f} ms"
            f" (min {min(times) * 1000:.0f})"
        )
    print(f"  pager shown: {statistics.median(pager) * 1000:.0f} ms")
    print("Store.list(limit=50) p50:")
    for label, ms in costs.items():
        print(f"  {label}: {ms:.2f} ms")
    print(f"load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
