"""The dashboard's first paint with 10,000 jobs in the store: a real server (``create_app``
under uvicorn) and headless Chromium (Debian's, through Playwright), the page loaded cold
``--runs`` times; the time from navigation to the first job row shown, and to the "load
more" button (the list is paged: 50 jobs a page, newest first, a cursor for the next).

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

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = Path(HERE).parent
sys.path.insert(0, str(ROOT))

from metrics_bench import fill  # noqa: E402
from tests.http.harness import Server  # noqa: E402

from outlast.store import open_store  # noqa: E402

CHROMIUM = "/usr/bin/chromium"


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
        server = Server(url, Path(tmp))
        first_row, more = [], []
        try:
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(
                    executable_path=CHROMIUM,
                    headless=True,
                    args=["--no-sandbox", "--disable-background-networking", "--disable-gpu"],
                )
                for _ in range(opts.runs):
                    page = browser.new_context(viewport={"width": 1360, "height": 860}).new_page()
                    t0 = time.perf_counter()
                    page.goto(f"{server.url}/")
                    page.locator("#jobs tr").first.wait_for()
                    first_row.append(time.perf_counter() - t0)
                    page.locator("#more").wait_for()
                    more.append(time.perf_counter() - t0)
                    rows = page.locator("#jobs tr").count()
                    page.context.close()
                browser.close()
        finally:
            server.close()
            store.close()
    print(
        f"dashboard at {opts.jobs:,} jobs ({rows} rows on the first page), {opts.runs} cold loads:"
        f" first row p50 {statistics.median(first_row) * 1000:.0f} ms"
        f" (min {min(first_row) * 1000:.0f}), 'load more' p50"
        f" {statistics.median(more) * 1000:.0f} ms; load {os.getloadavg()[0]:.1f}"
    )


if __name__ == "__main__":
    main()
