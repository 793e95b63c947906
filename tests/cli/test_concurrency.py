"""Many ``outlast run`` at once: every job is recorded once and every one finishes."""

from __future__ import annotations

import subprocess

import pytest

from tests.cli.helpers import OUTLAST, Outlast

N = 50


@pytest.mark.timeout(120)
def test_fifty_runs_started_at_once_are_all_recorded_and_all_finish(cli: Outlast) -> None:
    starters = [
        subprocess.Popen(
            [OUTLAST, "run", "--label", f"n={i}", "--", "sh", "-c", "echo $OUTLAST_JOB_ID"],
            env=cli.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(N)
    ]
    ids = []
    for starter in starters:
        out, err = starter.communicate(timeout=90)
        assert starter.returncode == 0, (starter.returncode, out, err)
        assert err == ""
        ids.append(out.strip())
    assert len(set(ids)) == N, "every run got its own id"

    for job_id in ids:  # the store's own blocking wait: woken by its notification, no polling
        state = cli.store.wait(job_id, timeout=60)
        assert state.terminal, f"job {job_id} is still {state.status}"

    listed = cli("ls", "--limit", "100", "--json").json()["jobs"]
    assert len(listed) == N
    assert {d["id"] for d in listed} == set(ids)
    assert {d["status"] for d in listed} == {"succeeded"}, [
        (d["id"], d["status"], d["error"]) for d in listed if d["status"] != "succeeded"
    ]
    assert all(d["attempts"] == 1 for d in listed)
    for i, job_id in enumerate(ids):
        assert cli.log_path(job_id).read_text() == f"{job_id}\n"
        assert next(d for d in listed if d["id"] == job_id)["labels"] == {"n": str(i)}
    assert len(cli("ls", "--status", "succeeded", "--limit", "100", "--json").json()["jobs"]) == N
