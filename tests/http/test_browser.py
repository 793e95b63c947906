"""The dashboard in a real browser: headless Chromium (Debian's package) driven by Playwright.

It loads the dashboard of a token-protected server with ``?token=``, sees a running job's
progress advance live, opens the job, presses cancel (and confirms) and sees ``canceled``,
then answers a paused job's question; afterwards the server's access log holds no token. It
takes the screenshots the README shows, ``dashboard.png`` (the list) and
``dashboard-job.png``, into the test's folder, or into ``$OUTLAST_SCREENSHOTS`` (what
``scripts/screenshots`` does to refresh ``docs/``): a test run leaves the checkout as it was.
Other tests drive the schedules page, retry and bulk actions, a phone's screen, the list's
search (name, id prefix, label) and its pages, and the last hour's chart.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from outlast.store import Store, open_store
from tests.http.conftest import TOKEN
from tests.http.harness import ROOT, Server, finish, start_worker

CHROMIUM = Path("/usr/bin/chromium")


def shots(tmp_path: Path) -> Path:
    """Where the screenshots go: ``$OUTLAST_SCREENSHOTS`` (relative to the checkout), else
    the test's own folder."""
    chosen = os.environ.get("OUTLAST_SCREENSHOTS")
    folder = ROOT / chosen if chosen else tmp_path
    folder.mkdir(parents=True, exist_ok=True)
    return folder


pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="needs Debian's chromium at /usr/bin/chromium (apt-get install chromium)",
)


@pytest.fixture
def page() -> Iterator[Any]:
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM),
            headless=True,
            args=["--no-sandbox", "--disable-background-networking", "--disable-gpu"],
        )
        try:
            context = browser.new_context(viewport={"width": 1360, "height": 860})
            yield context.new_page()
        finally:
            browser.close()


def _scenery(store: Store) -> str:
    """Jobs in every state, so the screenshot shows what the dashboard looks like in use."""
    done = store.create(kind="function", name="reports.monthly", labels={"team": "finance"})
    done.start()
    for step, pct in (("query", 30), ("render", 80), ("upload", 100)):
        done.report(step, "completed", {"rows": 1280}, progress=pct)
    done.succeed({"url": "s3://reports/2026-11.pdf", "pages": 14})
    failed = store.create(kind="function", name="ingest.partner_feed", labels={"team": "data"})
    failed.start()
    failed.report("download", "progress", None, progress=35)
    failed.fail(ConnectionError("partner API answered 503 three times"), retry=False)
    asks = store.create(kind="function", name="deploy.production", labels={"env": "prod"})
    asks.start()
    asks.report("plan", "completed", {"changes": 3}, progress=50)
    asks.pause({"question": "Apply 3 changes to prod?"})
    store.create(kind="command", command=["pg_dump", "-Fc", "shop"], labels={"team": "ops"})
    store.create(kind="function", name="emails.digest", labels={"team": "growth"})
    return asks.id


@pytest.fixture
def shown(tmp_path: Path) -> Iterator[tuple[Server, Store, str]]:
    """A server of its own over a fresh store: the screenshots show only this test's jobs."""
    os.chmod(tmp_path, 0o700)
    url = f"sqlite://{tmp_path}/dashboard.db"
    store = open_store(url)
    server = Server(url, tmp_path, token=TOKEN, env={"OUTLAST_TEST_ACCESS_LOG": "1"})
    try:
        yield server, store, url
    finally:
        server.close()
        store.close()


def test_the_dashboard_follows_a_job_live_and_cancels_it(
    page: Any, shown: tuple[Server, Store, str], tmp_path: Path
) -> None:
    secured, http_store, http_store_url = shown
    paused = _scenery(http_store)
    job = http_store.create(kind="function", name="video.transcode", labels={"team": "media"})
    worker = start_worker(
        http_store_url, job.id, "--events", "800", "--interval", "0.05", "--step", "encode"
    )
    problems: list[str] = []
    page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
    page.on("console", lambda msg: _console(msg, problems))
    page.on("response", lambda response: _response(response, problems))
    asked: list[str] = []

    def accept(dialog: Any) -> None:
        asked.append(dialog.message)
        dialog.accept()

    page.on("dialog", accept)
    folder = shots(tmp_path)
    try:
        page.goto(f"{secured.url}/?token={TOKEN}")
        row = page.locator(f'tr[data-id="{job.id}"]')
        row.wait_for()
        assert "token=" not in page.url  # traded for a session cookie, out of the address bar
        assert page.evaluate("() => JSON.stringify(sessionStorage) + document.cookie") == "{}"
        # Live: the percentage in the row climbs without a reload.
        first = _percent(row.locator(".pct").inner_text(), default=0)
        page.wait_for_function(
            """([id, first]) => {
                const pct = document.querySelector(`tr[data-id="${id}"] .pct`);
                return pct && parseFloat(pct.textContent) >= Math.max(first + 5, 20);
            }""",
            arg=[job.id, first],
            timeout=20000,
        )
        assert page.locator("#live").get_attribute("data-state") == "live"
        page.screenshot(path=str(folder / "dashboard.png"))

        row.click()
        page.locator("#job-status").filter(has_text="running").wait_for()
        page.wait_for_function("() => document.querySelectorAll('#events li').length >= 5")
        before = _percent(page.locator("#job-progress-text .pct-big").inner_text(), default=0)
        page.wait_for_function(
            """(before) => parseFloat(
                document.querySelector('#job-progress-text .pct-big').textContent) > before""",
            arg=before,
            timeout=20000,
        )
        page.get_by_role("button", name="Cancel job").click()
        page.locator("#job-status").filter(has_text="canceled").wait_for(timeout=10000)
        assert asked == ["Cancel job video.transcode? Its work is stopped."]
        assert page.locator("#outcome-title").text_content() == "Canceled"
        page.locator("#toast").evaluate("toast => { toast.hidden = true; }")
        page.screenshot(path=str(folder / "dashboard-job.png"))
        assert http_store.get(job.id).status == "canceled"

        # Back to the list, open the job that asks a question, answer it.
        page.get_by_role("link", name="All jobs").click()
        page.locator(f'tr[data-id="{paused}"]').click()
        page.locator("#question").filter(has_text="Apply 3 changes").wait_for()
        page.locator("#answer").fill('{"approve": true}')
        page.get_by_role("button", name="Resume job").click()
        page.locator("#job-status").filter(has_text="pending").wait_for(timeout=10000)
        assert http_store.get(paused).answer == {"approve": True}
    finally:
        finish(worker, timeout=30)  # it stops by itself once the job is canceled
    assert not problems, problems
    log = secured.output()
    assert "GET /events HTTP/1.1" in log and "POST /session HTTP/1.1" in log  # it logs
    assert TOKEN not in log, "the token reached the server's log"
    assert "token=***" in log  # the first page load's ?token=, masked


def _console(message: Any, problems: list[str]) -> None:
    # A failed request is logged by the browser too; _response judges those.
    if message.type == "error" and not message.text.startswith("Failed to load resource"):
        problems.append(f"console: {message.text}")


def _response(response: Any, problems: list[str]) -> None:
    # The only expected miss: the log of a job that has none (its worker writes no file).
    if response.status >= 400 and not (response.status == 404 and "/log?" in response.url):
        problems.append(f"{response.status} {response.url}")


def _percent(text: str, default: float) -> float:
    match = re.search(r"[\d.]+", text)
    return float(match.group()) if match else default


def test_the_dashboard_asks_for_the_token_it_lacks(
    page: Any, shown: tuple[Server, Store, str]
) -> None:
    secured, store, _ = shown
    job = store.create(kind="function", name="needs.token")
    page.goto(f"{secured.url}/")
    dialog = page.locator("#token-dialog")
    dialog.wait_for()
    assert dialog.get_attribute("open") is not None
    page.locator("#token-input").fill(TOKEN)
    page.get_by_role("button", name="Continue").click()
    page.locator(f'tr[data-id="{job.id}"]').wait_for()
    page.locator("#live[data-state='live']").wait_for()
    # the page keeps no token: the session is an HttpOnly cookie it cannot read
    assert page.evaluate("() => JSON.stringify(sessionStorage) + document.cookie") == "{}"
    [cookie] = [c for c in page.context.cookies() if c["name"] == "outlast_session"]
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and TOKEN not in cookie["value"]


def test_the_schedules_page_shows_next_runs_and_acts(
    page: Any, shown: tuple[Server, Store, str], tmp_path: Path
) -> None:
    """The schedules page lists each schedule's next run and last job; Pause, Resume and
    Run now act on the store; a delayed job says when it runs."""
    from datetime import UTC, datetime, timedelta

    from outlast import cron

    secured, store, _ = shown
    template = cron.template("command", "backup", command=["./backup.sh", "--all"])
    store.add_schedule(
        cron.new_schedule("nightly-backup", template, cron="0 3 * * *", tz="Europe/Berlin")
    )
    report = cron.template("function", "reports.weekly")
    store.add_schedule(cron.new_schedule("weekly-report", report, every=7 * 86400))
    delayed = store.create(
        kind="function", name="emails.reminder", run_after=datetime.now(UTC) + timedelta(hours=2)
    )
    store.set_slots("gpu", 2)
    problems: list[str] = []
    page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
    page.on("response", lambda response: _response(response, problems))
    page.goto(f"{secured.url}/?token={TOKEN}")
    row = page.locator(f'tr[data-id="{delayed.id}"]')
    row.wait_for()
    assert "runs in 1h 59m" in row.inner_text() or "runs in 2h" in row.inner_text()
    page.get_by_role("link", name="Schedules").click()
    page.locator('#queues tr[data-id="default"]').wait_for()  # the queues, above
    nightly = page.locator('tr[data-id="nightly-backup"]')
    nightly.wait_for()
    text = nightly.inner_text()
    assert "cron 0 3 * * * (Europe/Berlin)" in text and "./backup.sh --all" in text
    assert "not yet" in text and re.search(r"in \d+h", text), text
    assert "every 7d" in page.locator('tr[data-id="weekly-report"]').inner_text()
    gpu = page.locator('#groups tr[data-id="gpu"]')
    gpu.wait_for()
    assert gpu.inner_text().split() == ["gpu", "2", "0"]
    page.screenshot(path=str(tmp_path / "dashboard-schedules.png"))

    nightly.get_by_role("button", name="Pause").click()
    nightly.locator(".pill.paused").wait_for()
    assert store.get_schedule("nightly-backup").paused
    nightly.get_by_role("button", name="Resume").click()
    nightly.get_by_role("button", name="Pause").wait_for()
    assert not store.get_schedule("nightly-backup").paused

    page.locator('tr[data-id="weekly-report"]').get_by_role("button", name="Run now").click()
    link = page.locator('tr[data-id="weekly-report"] a.job-link')
    link.wait_for()
    job = store.get_schedule("weekly-report").last_job
    assert job is not None and store.get(job).fired is not None
    link.click()
    page.locator("#job-meta").filter(has_text="weekly-report").wait_for()
    assert "run by hand" in page.locator("#job-meta").inner_text()
    assert not problems, problems


def test_retry_from_the_job_page_and_bulk_retry_from_the_list(
    page: Any, shown: tuple[Server, Store, str]
) -> None:
    secured, store, _ = shown
    failed = []
    for i in range(3):
        task = store.create(kind="function", name=f"ingest.part{i}", labels={"team": "data"})
        task.start()
        try:
            raise ConnectionError("partner API answered 503")
        except ConnectionError as exc:  # raised: its traceback is kept
            task.fail(exc, retry=False)
        failed.append(task.id)
    problems: list[str] = []
    page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
    page.on("response", lambda response: _response(response, problems))
    asked: list[str] = []

    def accept(dialog: Any) -> None:
        asked.append(dialog.message)
        dialog.accept()

    page.on("dialog", accept)
    page.goto(f"{secured.url}/?token={TOKEN}#/jobs/{failed[0]}")
    page.locator("#job-status").filter(has_text="failed").wait_for()
    # the traceback is folded under the error; unfolded, it stays open across refreshes
    trace = page.locator("#outcome details.traceback")
    assert not trace.locator("pre").is_visible()
    trace.locator("summary").click()
    trace.locator("pre").filter(has_text="ConnectionError: partner API answered 503").wait_for()
    page.wait_for_timeout(300)
    assert page.locator("#outcome details.traceback[open] pre").is_visible()
    page.get_by_role("button", name="Retry").click()
    page.locator("#job-meta").filter(has_text="retry of").wait_for()
    [new] = store.retries_of(failed[0])
    assert page.url.endswith(f"#/jobs/{new}")
    assert store.get(new).retry_of == failed[0]
    page.locator("#job-meta a", has_text=failed[0]).click()  # back to the old job
    page.locator("#job-meta").filter(has_text="retried as").wait_for()

    page.get_by_role("link", name="All jobs").click()
    page.locator(".chip", has_text="failed").click()
    page.get_by_role("button", name="Retry all failed").click()
    page.wait_for_function("() => !document.querySelector('#toast').hidden")
    assert asked == ["Retry 3 failed jobs?"]
    assert all(len(store.retries_of(job)) == (2 if job == failed[0] else 1) for job in failed)
    assert not problems, problems


def test_a_phone_a_missing_job_and_a_wrong_token(
    page: Any, shown: tuple[Server, Store, str], tmp_path: Path
) -> None:
    secured, store, _ = shown
    _scenery(store)
    known = store.create(kind="function", name="reports.weekly", labels={"team": "finance"})
    problems: list[str] = []
    page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
    page.set_viewport_size({"width": 420, "height": 860})
    # a wrong token: the dialog says so, and the page claims nothing about the jobs
    page.goto(f"{secured.url}/")
    page.locator("#token-dialog[open]").wait_for()
    page.locator("#token-input").fill("not the token")
    page.locator("#token-form button").click()
    page.locator("#token-error").filter(has_text="Wrong token").wait_for()
    assert page.locator("#empty").is_hidden(), "'No jobs here yet' behind the dialog"
    page.locator("#token-input").fill(TOKEN)
    page.locator("#token-form button").click()
    row = page.locator(f'tr[data-id="{known.id}"]')
    row.wait_for()
    # on a phone the list keeps its step column in view
    step = page.locator("table.jobs thead th", has_text="Step").first.bounding_box()
    assert step is not None and step["x"] + step["width"] <= 420, step
    page.screenshot(path=str(shots(tmp_path) / "dashboard-phone.png"))
    # a failed job's error shows in the list
    failed = page.locator("tr.failed .err")
    assert "partner API answered 503" in failed.first.inner_text()
    # the keyboard opens a job: then a missing one, and nothing of the first stays
    row.focus()
    page.keyboard.press("Enter")
    page.locator("#job-status").filter(has_text="pending").wait_for()
    page.goto(f"{secured.url}/#/jobs/doesnotexist")
    page.locator("#job-name").filter(has_text="No such job").wait_for()
    assert page.locator("#job-status").inner_text() == ""
    assert page.locator("#job-meta").inner_text() == ""
    for button in ("#cancel", "#delete", "#retry"):
        assert page.locator(button).is_hidden(), button
    assert not problems, problems


def test_search_by_name_id_prefix_and_label(
    page: Any, shown: tuple[Server, Store, str], tmp_path: Path
) -> None:
    """The search box: a word finds names (any case), ``id:`` an id prefix, ``key=value`` a
    label, all together; a bad term says what is wrong; a pasted id finds its job; the
    search is in the address and survives a reload."""
    secured, store, _ = shown
    resize = [
        store.create(kind="function", name="images.Resize", labels={"team": "media"}).id
        for _ in range(3)
    ]
    mail = [
        store.create(kind="function", name="mail.send", labels={"team": "growth"}).id
        for _ in range(2)
    ]
    other = store.create(kind="command", command=["pg_dump", "shop"], labels={"team": "media"})
    problems: list[str] = []
    page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
    page.on("response", lambda response: _search_response(response, problems))
    page.goto(f"{secured.url}/?token={TOKEN}")
    page.locator(f'tr[data-id="{other.id}"]').wait_for()

    def search(text: str, expected: list[str]) -> None:
        page.locator("#search").fill(text)
        page.locator("#search").press("Enter")
        _rows_are(page, expected)

    search("RESIZE", resize[::-1])
    assert page.url.endswith("#/?q=RESIZE")
    search("team=growth", mail[::-1])
    search("team=media", [other.id, *resize[::-1]])
    search("resize team=media", resize[::-1])
    search(f"id:{mail[0][:16]}", [j for j in mail[::-1] if j.startswith(mail[0][:16])])
    search(f"id:{resize[1]}", [resize[1]])
    page.screenshot(path=str(shots(tmp_path) / "dashboard-search.png"))
    # an id pasted as a bare word: no name holds it, so the id prefix is searched
    search(mail[1], [mail[1]])
    assert "whose id starts with it" in page.locator("#summary").inner_text()
    # bad input: said under the box, and the list is left as it was
    page.locator("#search").fill("id:a/b")
    page.locator("#search").press("Enter")
    error = page.locator("#search-error")
    error.filter(has_text="no job id starts with 'a/b'").wait_for()
    assert page.locator("#search").get_attribute("aria-invalid") == "true"
    search("nosuchname", [])
    assert page.locator("#search-error").is_hidden()
    assert page.locator("#no-match").is_visible() and page.locator("#empty").is_hidden()
    # the search lives in the address: a reload (or a shared link) keeps it
    search("mail", mail[::-1])
    page.reload()
    _rows_are(page, mail[::-1])
    assert page.locator("#search").input_value() == "mail"
    # the job page's way back returns to the search
    page.locator(f'tr[data-id="{mail[0]}"]').click()
    page.locator("#job-status").filter(has_text="pending").wait_for()
    page.get_by_role("link", name="All jobs").click()
    _rows_are(page, mail[::-1])
    # a job made now that matches shows up live; one that does not, does not
    fresh = store.create(kind="function", name="mail.send").id
    store.create(kind="function", name="images.Resize")
    _rows_are(page, [fresh, *mail[::-1]])
    assert not problems, problems


def test_pages_of_the_list(page: Any, shown: tuple[Server, Store, str]) -> None:
    """More jobs than a page: Older and Newer walk pages of 50 by their cursors (no job
    twice, none left out), Newest goes back to the first; a job made meanwhile joins the
    first page only."""
    secured, store, _ = shown
    made = [store.create(kind="function", name=f"batch.{i:03d}").id for i in range(123)]
    newest = made[::-1]
    problems: list[str] = []
    page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
    page.on("response", lambda response: _response(response, problems))
    page.goto(f"{secured.url}/?token={TOKEN}")
    _rows_are(page, newest[:50])
    assert page.locator("#page-label").inner_text() == "Page 1"
    assert page.locator("#page-newer").is_disabled() and page.locator("#page-older").is_enabled()
    page.locator("#page-older").click()
    _rows_are(page, newest[50:100])
    assert page.locator("#page-label").inner_text() == "Page 2"
    late = store.create(kind="function", name="batch.late").id  # the newest page's, not this
    page.locator("#page-older").click()
    _rows_are(page, newest[100:])
    assert page.locator("#page-label").inner_text() == "Page 3"
    assert page.locator("#page-older").is_disabled()
    page.locator("#page-newer").click()
    _rows_are(page, newest[50:100])
    page.locator("#page-first").click()
    _rows_are(page, [late, *newest[:49]], prefix=True)
    assert page.locator("#page-label").inner_text() == "Page 1"
    # a status filter starts at its own first page
    page.locator("#page-older").click()
    page.locator("#page-label").filter(has_text="Page 2").wait_for()
    page.locator(".chip", has_text="pending").click()
    page.locator("#page-label").filter(has_text="Page 1").wait_for()
    assert not problems, problems


def test_the_chart_shows_the_last_hour(
    page: Any, shown: tuple[Server, Store, str], tmp_path: Path
) -> None:
    """The "Last hour" card draws the store's timeline with uPlot: finished jobs per minute
    by outcome and the wait before starting (median, 95th percentile); a job that ends is
    drawn soon after."""
    secured, store, _ = shown
    for i in range(7):
        task = store.create(kind="function", name="chart.job")
        task.start()
        if i < 5:
            task.succeed(i)
        else:
            task.fail("boom", retry=False)
    problems: list[str] = []
    page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
    page.on("console", lambda msg: _console(msg, problems))
    page.on("response", lambda response: _response(response, problems))
    page.goto(f"{secured.url}/?token={TOKEN}")
    card = page.locator("#activity[data-finished='7']")
    card.wait_for()
    for chart in ("#chart-throughput", "#chart-wait"):
        assert page.locator(f"{chart} canvas").count() == 1, chart
        box = page.locator(f"{chart} canvas").bounding_box()
        assert box is not None and box["width"] > 200 and box["height"] > 100, box
    drawn = page.evaluate(
        """() => ({
            times: CHART.plots.throughput.data[0].length,
            succeeded: CHART.plots.throughput.data[1].reduce((a, b) => a + b, 0),
            failed: CHART.plots.throughput.data[2].reduce((a, b) => a + b, 0),
            waits: CHART.plots.wait.data[1].filter((v) => v !== null).length,
            legend: document.querySelector('#chart-throughput .u-legend').textContent,
        })"""
    )
    assert drawn["times"] == 60 and drawn["succeeded"] == 5 and drawn["failed"] == 2, drawn
    assert drawn["waits"] >= 1 and "succeeded" in drawn["legend"], drawn
    assert "7 finished (2 failed)" in page.locator("#activity-note").inner_text()
    assert "7 in all" in (page.locator("#chart-throughput").get_attribute("aria-label") or "")
    page.screenshot(path=str(shots(tmp_path) / "dashboard-chart.png"))
    # live: a job that ends now is drawn without a reload
    task = store.create(kind="function", name="chart.job")
    task.start()
    task.succeed(None)
    page.locator("#activity[data-finished='8']").wait_for(timeout=10000)
    assert not problems, problems


def _rows_are(page: Any, expected: list[str], prefix: bool = False) -> None:
    """Wait until the list shows exactly these job ids, in this order (``prefix``: its
    first rows are these)."""
    try:
        page.wait_for_function(
            """([ids, prefix]) => {
                const shown = [...document.querySelectorAll('#jobs tr')].map((r) => r.dataset.id);
                const head = prefix ? shown.slice(0, ids.length) : shown;
                return JSON.stringify(head) === JSON.stringify(ids);
            }""",
            arg=[expected, prefix],
            timeout=10000,
        )
    except Exception:
        shown = page.evaluate(
            "() => [...document.querySelectorAll('#jobs tr')].map((r) => r.dataset.id)"
        )
        raise AssertionError(f"rows {shown}, expected {expected}; {page.url}") from None


def _search_response(response: Any, problems: list[str]) -> None:
    # the one refusal asked for: the search with a bad id prefix
    if response.status == 400 and "id_prefix=a%2Fb" in response.url:
        return
    _response(response, problems)
