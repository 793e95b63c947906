"""Driving jobs: the supervisor of command jobs, spawning detached workers, the pool, and
reconciling jobs whose worker died."""

# Loading the run layer gives the store's waits its reconciler (reap registers it).
from outlast.run import reap as _reap  # noqa: F401
