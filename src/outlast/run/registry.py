"""Registered jobs: the registry that ``@outlast.job`` and ``Pipeline`` fill, and the lookups
that workers and the edges use.

A function job is stored by name with its JSON arguments and the module that registered it, so
a worker that has not imported that module yet can import it and find the name (the module
comes from the store, which the worker trusts; the HTTP edge never imports anything and accepts
only names registered in its own process).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from outlast.errors import InvalidInput
from outlast.ids import check_queue
from outlast.model import JobState

_REGISTRY: dict[str, JobSpec] = {}


@dataclass(frozen=True)
class JobSpec:
    """A registered job function and its defaults."""

    #: The name jobs are submitted by.
    name: str
    #: The function; called with the job's ``args`` and ``kwargs``.
    fn: Callable[..., Any]
    #: Attempts before a failure is final; None: ``$WORKER_MAX_RETRIES``.
    attempts: int | None = None
    #: Seconds an attempt may run before it is killed (code ``timeout``); None: no limit.
    timeout: float | None = None
    #: The queue its jobs go to.
    queue: str = "default"
    #: ``function`` or ``pipeline``.
    kind: str = "function"
    #: The module that defines the job, if not ``fn.__module__`` (pipelines).
    origin: str | None = None
    #: A pipeline's ``ALL_DONE`` stages, which run even when its worker dies.
    cleanup: tuple[str, ...] = ()
    #: Its jobs' priority (higher first), unless a call says otherwise.
    priority: int = 0
    #: A concurrency key template, formatted with the call's arguments (a pipeline's: its
    #: payload), e.g. ``"tenant:{tenant_id}"``; and the key's slots. None: unlimited.
    limit_key: str | None = None
    limit: int | None = None
    #: Declared schedule options (``cron_expr``, ``every``, ``tz``, …) from
    #: ``@outlast.job(cron=…)``, stored by the pools that import the module; else None.
    schedule: dict[str, Any] | None = None

    @property
    def module(self) -> str:
        return self.origin or getattr(self.fn, "__module__", "") or ""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Calling the decorated function runs it here and now, like the plain function."""
        return self.fn(*args, **kwargs)


def check_options(attempts: int | None, timeout: float | None, queue: str) -> None:
    """Refuse job options that cannot work, saying which."""
    if attempts is not None and (not isinstance(attempts, int) or attempts < 1):
        raise InvalidInput(f"attempts must be a whole number >= 1, not {attempts!r}")
    if timeout is not None and (not isinstance(timeout, int | float) or not timeout > 0):
        raise InvalidInput(f"timeout must be a number of seconds > 0, not {timeout!r}")
    check_queue(queue)


def register(spec: JobSpec) -> JobSpec:
    existing = _REGISTRY.get(spec.name)
    if (
        existing is not None
        and existing.fn is not spec.fn
        and (
            existing.module != spec.module
            or getattr(existing.fn, "__qualname__", spec.name)
            != getattr(spec.fn, "__qualname__", spec.name)
        )
    ):
        raise InvalidInput(f"job name {spec.name!r} is already registered by {existing.module}")
    _REGISTRY[spec.name] = spec
    return spec


def declared_schedules() -> list[JobSpec]:
    """The registered jobs that declare a schedule, by name."""
    return [spec for _, spec in sorted(_REGISTRY.items()) if spec.schedule]


def names() -> list[str]:
    return sorted(_REGISTRY)


def lookup(name: str) -> JobSpec:
    """The registered job ``name``, or :class:`InvalidInput` saying which names exist."""
    spec = _REGISTRY.get(name)
    if spec is None:
        known = ", ".join(names()) or "none"
        raise InvalidInput(f"unknown job name {name!r} (registered: {known})")
    return spec


def resolve(state: JobState) -> JobSpec:
    """The function of a stored job, importing the module that registered it if need be."""
    spec = _REGISTRY.get(state.name)
    if spec is None and state.call is not None:
        module = state.call.module
        if module and module != "__main__":
            importlib.import_module(module)
    return lookup(state.name)


def import_modules(modules: list[str]) -> None:
    """Import the modules that register jobs (``outlast worker --import MODULE``)."""
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise InvalidInput(f"cannot import {module!r}: {exc}") from exc


def limit_key_of(
    spec: JobSpec, args: list[Any], kwargs: dict[str, Any], payload: Any
) -> str | None:
    """The job's concurrency key for one call: its template formatted with the call's
    arguments by name (a pipeline's: its payload's keys); InvalidInput naming what is
    missing."""
    template = spec.limit_key
    if template is None:
        return None
    if spec.kind == "pipeline":
        values = dict(payload or {})
    else:
        import inspect

        try:
            bound = inspect.signature(spec.fn).bind(*args, **kwargs)
        except TypeError as exc:
            raise InvalidInput(f"job {spec.name!r}: {exc}") from None
        except ValueError:  # no signature to read (a builtin): keyword arguments only
            values = dict(kwargs)
        else:
            bound.apply_defaults()
            values = dict(bound.arguments)
    try:
        return template.format(**values)
    except (KeyError, IndexError) as exc:
        raise InvalidInput(
            f"job {spec.name!r}: its limit_key {template!r} names {exc}, which the call does "
            "not give"
        ) from None
    except ValueError as exc:
        raise InvalidInput(f"job {spec.name!r}: bad limit_key {template!r}: {exc}") from None
