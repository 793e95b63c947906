"""A FastAPI app that starts outlast jobs from its routes and serves their progress.

- ``POST /fingerprints`` submits a job (``await outlast.asubmit``: the event loop never waits
  for the store) and answers at once with the job's id and where to follow it;
- ``GET /fingerprints/{id}?wait=5`` answers with the job, waiting up to ``wait`` seconds for
  it to finish (``await task.await_done``, woken by the store, not by polling);
- outlast's own HTTP API is mounted under ``/outlast``: the job document
  (``/outlast/jobs/{id}``), its events as Server-Sent Events with replay
  (``/outlast/jobs/{id}/events``), its log, and the dashboard (``/outlast/``).

Run it (the store: ``$OUTLAST_STORE``, else outlast's default SQLite file)::

    outlast worker --async --import examples.fastapi_app.jobs &
    uvicorn examples.fastapi_app.app:app
"""

from __future__ import annotations

from typing import Any

from examples.fastapi_app.jobs import fingerprint
from fastapi import FastAPI, HTTPException, Query
from pydantic import BaseModel, Field

import outlast
from outlast.http.app import create_app

store = outlast.use_store(None)  # $OUTLAST_STORE, or the default
app = FastAPI(title="fingerprints")
app.mount("/outlast", create_app(store))


class FingerprintRequest(BaseModel):
    text: str = Field(min_length=1, max_length=100_000)
    rounds: int = Field(default=5, ge=1, le=100)


@app.post("/fingerprints", status_code=202)
async def start(request: FingerprintRequest) -> dict[str, Any]:
    task = await outlast.asubmit(
        fingerprint.options(labels={"via": "fastapi"}), request.text, rounds=request.rounds
    )
    return {
        "id": task.id,
        "job": f"/outlast/jobs/{task.id}",
        "events": f"/outlast/jobs/{task.id}/events",
    }


@app.get("/fingerprints/{job_id}")
async def result(job_id: str, wait: float = Query(default=0, ge=0, le=30)) -> dict[str, Any]:
    try:
        task = store.open(job_id)
        state = await (task.await_done(timeout=wait) if wait else task.astate())
    except outlast.JobNotFound:
        raise HTTPException(404, f"no job {job_id}") from None
    except outlast.InvalidInput as exc:
        raise HTTPException(400, str(exc)) from None
    return {"status": state.status, "progress": state.progress, "result": state.result}
