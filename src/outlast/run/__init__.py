"""Driving jobs: the supervisor of command jobs, spawning detached workers, the pool, and
reconciling jobs whose worker died."""
