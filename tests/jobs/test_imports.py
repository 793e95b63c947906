"""``--import`` finds modules in the current folder (as ``python -m`` does) and accepts a
file path, for ``worker``, ``submit``, ``spawn`` and ``serve``; a failed import says which
module, where it was looked for, and what to try."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from outlast.model import Status
from tests.pool.conftest import Harness

MODULE = """
import outlast

@outlast.job(name="here.double")
def double(x):
    print("doubling", x)
    return 2 * x
"""


def _cli(pool: Harness, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(pool.env)
    env.pop("PYTHONPATH", None)  # only what the folder and the paths give
    return subprocess.run(
        [sys.executable, "-m", "outlast", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


def _worker(pool: Harness, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return _cli(pool, cwd, "worker", "--burst", *args)


def test_a_module_in_the_current_folder_is_found(pool: Harness, tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "mymodule.py").write_text(MODULE)
    submitted = _cli(
        pool, project, "submit", "here.double", "--import", "mymodule", "--args", "[21]"
    )
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    ran = _worker(pool, project, "--import", "mymodule")
    assert ran.returncode == 0, ran.stderr
    state = pool.get(job_id)
    assert (state.status, state.result) == (Status.SUCCEEDED, 42)
    assert pool.cli("logs", job_id).stdout == "doubling 21\n"


def test_a_file_path_is_accepted_from_any_folder(pool: Harness, tmp_path: Path) -> None:
    jobs = tmp_path / "project" / "jobs"
    jobs.mkdir(parents=True)
    (jobs / "tasks.py").write_text(MODULE)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    made = _cli(
        pool,
        tmp_path / "project",
        "submit",
        "here.double",
        "--import",
        "jobs/tasks.py",
        "--args",
        "[5]",
        "--json",
    )
    assert made.returncode == 0, made.stderr
    doc = json.loads(made.stdout)
    assert doc["call"]["module"] == "tasks"  # jobs/ is not a package: its folder is the root
    ran = _worker(pool, elsewhere, "--import", str(jobs / "tasks.py"))
    assert ran.returncode == 0, ran.stderr
    assert pool.get(doc["id"]).result == 10
    # a package: the module is named from the first folder that is not one
    (jobs / "__init__.py").write_text("")
    again = _cli(
        pool,
        elsewhere,
        "submit",
        "here.double",
        "--import",
        str(jobs / "tasks.py"),
        "--args",
        "[1]",
        "--json",
    )
    assert json.loads(again.stdout)["call"]["module"] == "jobs.tasks"
    spawned = _cli(
        pool,
        elsewhere,
        "spawn",
        "here.double",
        "--import",
        str(jobs / "tasks.py"),
        "--args",
        "[4]",
    )
    assert spawned.returncode == 0, spawned.stderr
    state = pool.wait_for(spawned.stdout.strip(), timeout=60)
    assert (state.status, state.result) == (Status.SUCCEEDED, 8), state


def test_a_failed_import_says_which_where_and_what_to_try(pool: Harness, tmp_path: Path) -> None:
    (tmp_path / "broken.py").write_text("def (:\n")
    (tmp_path / "needs.py").write_text("import not_installed_anywhere\n")
    for verb in (["worker", "--burst"], ["submit", "x"], ["spawn", "x"], ["serve", "--port", "0"]):
        missing = _cli(pool, tmp_path, *verb, "--import", "nosuchmodule")
        assert missing.returncode == 2, (verb, missing.stderr)
        err = missing.stderr
        assert err.startswith("outlast: error: cannot import 'nosuchmodule': No module named")
        assert "searched: " in err and str(tmp_path) in err and "--import jobs/tasks.py" in err
        assert "Traceback" not in err
    broken = _cli(pool, tmp_path, "worker", "--burst", "--import", "broken")
    assert broken.returncode == 2
    assert "SyntaxError" in broken.stderr and "broken.py, line 1" in broken.stderr
    needs = _cli(pool, tmp_path, "worker", "--burst", "--import", "needs.py")
    assert "No module named 'not_installed_anywhere'" in needs.stderr
    assert "searched" not in needs.stderr  # the module was found; what it imports was not
    nofile = _cli(pool, tmp_path, "worker", "--burst", "--import", "no/such/file.py")
    assert nofile.stderr.strip() == "outlast: error: cannot import 'no/such/file.py': no such file"


ASKING = """
import outlast

@outlast.job(name="here.ask", attempts=1)
def ask():
    ctx = outlast.current()
    if ctx.answer is None:
        raise outlast.Pause("go on?")
    return {"answer": ctx.answer}
"""


def test_a_spawned_job_restarted_from_another_folder_finds_its_module(
    pool: Harness, tmp_path: Path
) -> None:
    """A resume (or a reconcile) started anywhere restarts the job's dedicated worker with
    the caller's path: the folder the job's module was found in is on the job (call.path)."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "approval.py").write_text(ASKING)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    spawned = _cli(pool, project, "spawn", "here.ask", "--import", "approval", "--json")
    assert spawned.returncode == 0, spawned.stderr
    doc = json.loads(spawned.stdout)
    assert doc["call"]["path"] == str(project)
    pool.wait_for(doc["id"], {Status.PAUSED}, 60, "the job to pause")
    resumed = _cli(pool, elsewhere, "resume", doc["id"], "--answer", '"yes"')
    assert resumed.returncode == 0, resumed.stderr
    state = pool.wait_for(doc["id"], timeout=60)
    assert (state.status, state.result) == (Status.SUCCEEDED, {"answer": "yes"}), state
    # a module of this repository (not installed) records its folder too
    assert pool.get(pool.submit("pt.noop", 1)).call.path == str(Path(__file__).parents[2])
