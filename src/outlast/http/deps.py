"""Request dependencies shared by the routes: the app's store, and a job that must exist.

Module-level on purpose: FastAPI resolves the (postponed) annotations of a route in its
module's globals.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Path, Request

from outlast.model import JobState
from outlast.run import reap
from outlast.store import Store

JobId = Annotated[str, Path(description="the job's id", max_length=128)]


def app_store(request: Request) -> Store:
    store: Store = request.app.state.store
    return store


def existing_job(job_id: JobId, store: Annotated[Store, Depends(app_store)]) -> JobState:
    """The job, reconciled first if its worker died; :class:`JobNotFound` (404) if none."""
    return reap.reconcile(store, store.get(job_id))


ExistingJob = Annotated[JobState, Depends(existing_job)]
