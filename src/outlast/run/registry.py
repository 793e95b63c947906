"""Registered jobs: the registry that ``@outlast.job`` and ``Pipeline`` fill, and the lookups
that workers and the edges use.

A function job is stored by name with its JSON arguments and the module that registered it, so
a worker that has not imported that module yet can import it and find the name (the module
comes from the store, which the worker trusts; the HTTP edge never imports anything and accepts
only names registered in its own process).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import inspect
import os
import sys
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

    @functools.cached_property
    def is_async(self) -> bool:
        """An ``async def`` job: run on an event loop in the job's process."""
        return self.kind == "function" and inspect.iscoroutinefunction(self.fn)

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


def known_async(name: str) -> bool:
    """Whether ``name`` is registered here as an ``async def`` job."""
    spec = _REGISTRY.get(name)
    return spec is not None and spec.is_async


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
    """The function of a stored job, importing the module that registered it if need be
    (from this process's path, else from the folder its creator found it in)."""
    spec = _REGISTRY.get(state.name)
    if spec is None and state.call is not None:
        module = state.call.module
        if module and module != "__main__":
            folder = state.call.path
            if (
                folder
                and folder not in sys.path
                and importlib.util.find_spec(module.partition(".")[0]) is None
            ):
                sys.path.append(folder)
            importlib.import_module(module)
    return lookup(state.name)


def module_root(module: str) -> str | None:
    """The folder that holds ``module``'s top package as this process imported it, or None
    (not imported, no file, or under an installed prefix, where every process finds it).
    Worked out once per module and file."""
    found = sys.modules.get(module)
    where = getattr(found, "__file__", None)
    return _module_root(module, where) if isinstance(where, str) else None


@functools.lru_cache(maxsize=256)
def _module_root(module: str, where: str) -> str | None:
    if module == "__main__":
        return None
    root = os.path.dirname(os.path.abspath(where))
    if os.path.basename(where).startswith("__init__."):
        root = os.path.dirname(root)
    for _ in range(module.count(".")):
        root = os.path.dirname(root)
    if any(os.path.join(root, "").startswith(prefix) for prefix in _INSTALLED):
        return None
    return root


#: Where installed modules live: a module found there needs no folder recorded.
_INSTALLED = tuple(
    {os.path.join(p, "") for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    | {os.path.join(p, "") for p in sys.path if p.endswith(("site-packages", "dist-packages"))}
)


def import_modules(modules: list[str]) -> list[str]:
    """Import the modules that register jobs (``--import MODULE`` or ``--import FILE.py``);
    returns their module names.

    As ``python -m`` does, the current folder is searched first. A file path inside the
    current folder is imported by its dotted name (``jobs/tasks.py`` is ``jobs.tasks``), so
    that submitters and workers started there agree on it; one outside it by its file name,
    its folder searched first. An import that fails says which module, where it was looked
    for, and what to try.
    """
    names = []
    for given in modules:
        name = _module_name(given)
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and name != exc.name and not name.startswith(f"{exc.name}."):
                raise InvalidInput(f"cannot import {given!r}: {exc}") from exc  # its own import
            searched = ", ".join(p or "." for p in sys.path)
            raise InvalidInput(
                f"cannot import {given!r}: {exc} (searched: {searched}); run from the folder "
                "that holds it, give its file (--import jobs/tasks.py), or add its folder to "
                "PYTHONPATH"
            ) from exc
        except Exception as exc:  # an error in the module itself: where it is
            where = ""
            tb = exc.__traceback__
            while tb is not None:
                frame = tb.tb_frame.f_code.co_filename
                if not frame.startswith("<frozen"):
                    where = f" ({frame}, line {tb.tb_lineno})"
                tb = tb.tb_next
            if isinstance(exc, SyntaxError):
                where = ""  # its message says where
            raise InvalidInput(
                f"cannot import {given!r}: {type(exc).__name__}: {exc}{where}"
            ) from exc
        names.append(name)
    return names


def _module_name(given: str) -> str:
    """The module name of ``--import`` text (a dotted name or a ``.py`` file), with the
    folder it is found from put on ``sys.path``: for a file, the first folder above it that
    is not a package (has no ``__init__.py``), as pytest finds a test file's root, so the
    name is the same from any current folder (``jobs/tasks.py`` is ``tasks``, or
    ``jobs.tasks`` when ``jobs`` is a package)."""
    if not (given.endswith(".py") or os.sep in given):
        here = os.getcwd()
        if here not in sys.path and "" not in sys.path:
            sys.path.insert(0, here)
        return given
    path = os.path.abspath(given)
    if not os.path.isfile(path):
        raise InvalidInput(f"cannot import {given!r}: no such file")
    if not path.endswith(".py"):
        raise InvalidInput(f"cannot import {given!r}: a module file ends in .py")
    folder, stem = os.path.split(path[:-3])
    parts = [] if stem == "__init__" else [stem]
    while os.path.isfile(os.path.join(folder, "__init__.py")):
        folder, package = os.path.split(folder)
        parts.insert(0, package)
    if not parts or not all(p.isidentifier() for p in parts):
        raise InvalidInput(f"cannot import {given!r}: {'.'.join(parts)!r} is not a module name")
    if folder not in sys.path:
        sys.path.insert(0, folder)
    return ".".join(parts)


def inherit_sys_path() -> None:
    """Search the folders the starting process searched (``$OUTLAST_SYS_PATH``, set for the
    job processes and detached workers it starts)."""
    extra = os.environ.get("OUTLAST_SYS_PATH")
    if extra:
        import json

        with contextlib.suppress(ValueError, TypeError):
            folders = [p for p in json.loads(extra) if isinstance(p, str)]
            sys.path[:0] = [p for p in folders if p not in sys.path]


_signatures: dict[Callable[..., Any], inspect.Signature | None] = {}


def signature(fn: Callable[..., Any]) -> inspect.Signature | None:
    """``fn``'s signature (cached), or None when it has none to read (some builtins)."""
    try:
        return _signatures[fn]
    except KeyError:
        pass
    except TypeError:  # not hashable: read it each time
        return _read_signature(fn)
    found = _signatures[fn] = _read_signature(fn)
    return found


def _read_signature(fn: Callable[..., Any]) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return None


def bind(spec: JobSpec, args: list[Any], kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """The call's arguments by name, defaults applied; :class:`InvalidInput` saying what is
    wrong when the function does not take them (None: it has no signature to check)."""
    sig = signature(spec.fn)
    if sig is None:
        return None
    try:
        bound = sig.bind(*args, **kwargs)
    except TypeError as exc:
        plain = sig.replace(
            parameters=[p.replace(annotation=p.empty) for p in sig.parameters.values()],
            return_annotation=sig.empty,
        )
        raise InvalidInput(f"job {spec.name!r} takes {spec.name}{plain}: {exc}") from None
    bound.apply_defaults()
    return dict(bound.arguments)


def check_call(spec: JobSpec, args: list[Any], kwargs: dict[str, Any]) -> None:
    """:func:`bind`'s check without its result: :class:`InvalidInput` when the function does
    not take these arguments. For a function of plain parameters (no ``*args``,
    ``**kwargs``, positional- or keyword-only ones) it counts and looks up names, which is
    exact for such a signature and several times faster than binding (a batch of a million
    calls); any other signature, and every refusal (for its message), goes to :func:`bind`."""
    shape = _shape(spec.fn)
    if shape is not None:
        names, required = shape
        given = len(args)
        fits = given <= len(names) and (
            not kwargs
            or (all(k in names for k in kwargs) and not any(k in kwargs for k in names[:given]))
        )
        if fits and (given >= required or all(n in kwargs for n in names[given:required])):
            return
    bind(spec, args, kwargs)


_shapes: dict[Any, tuple[tuple[str, ...], int] | None] = {}


def _shape(fn: Callable[..., Any]) -> tuple[tuple[str, ...], int] | None:
    """``(names, how many have no default)`` of a signature of plain parameters whose
    defaults all come after them, else None (cached)."""
    try:
        return _shapes[fn]
    except KeyError:
        pass
    except TypeError:  # not hashable
        return None
    sig = signature(fn)
    found = None
    if sig is not None:
        params = list(sig.parameters.values())
        required = sum(p.default is p.empty for p in params)
        if all(p.kind == p.POSITIONAL_OR_KEYWORD for p in params) and all(
            p.default is p.empty for p in params[:required]
        ):
            found = (tuple(p.name for p in params), required)
    _shapes[fn] = found
    return found


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
        bound = bind(spec, args, kwargs)
        values = dict(kwargs) if bound is None else bound  # no signature: keywords only
    try:
        return template.format(**values)
    except (KeyError, IndexError) as exc:
        raise InvalidInput(
            f"job {spec.name!r}: its limit_key {template!r} names {exc}, which the call does "
            "not give"
        ) from None
    except ValueError as exc:
        raise InvalidInput(f"job {spec.name!r}: bad limit_key {template!r}: {exc}") from None
