"""Immutable JSON containers: what a :class:`~outlast.model.JobState` holds inside.

A state is shared: a store hands the same object to every reader of an unchanged job, and a
pool hands the state it claimed to the job it runs. So nothing nested in a state may change
after it is made: its dicts are :class:`FrozenDict` and its lists :class:`FrozenList`, which
refuse every mutation with a ``TypeError`` that says to copy first (:func:`thaw`).

They are subclasses of ``dict`` and ``list`` on purpose: they compare equal to plain ones,
pass ``isinstance`` checks, print the same, and orjson and the standard library encode them
as JSON without help. They pickle and copy as themselves. (Python lets a determined caller
write through the base class, ``dict.update(frozen, …)``, or a state's ``vars()``: that is
not a use, it is a bypass, and nothing in outlast does it.)
"""

from __future__ import annotations

from typing import Any, NoReturn

_MESSAGE = "a job's state is immutable: change a copy (outlast.frozen.thaw(value))"


def _refuse(*args: Any, **kwargs: Any) -> NoReturn:
    raise TypeError(_MESSAGE)


class FrozenDict(dict[str, Any]):
    """A ``dict`` that cannot be changed (made by :func:`freeze` or :func:`frozen_dict`;
    calling the class, which would let ``__init__`` refill one, is refused too)."""

    __slots__ = ()
    __init__ = __setitem__ = __delitem__ = clear = pop = popitem = setdefault = _refuse
    update = __ior__ = _refuse

    def __reduce__(self) -> tuple[Any, ...]:
        return (frozen_dict, (dict(self),))

    def __copy__(self) -> FrozenDict:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> FrozenDict:
        return self


class FrozenList(list[Any]):
    """A ``list`` that cannot be changed (made by :func:`freeze` or :func:`frozen_list`;
    calling the class, which would let ``__init__`` refill one, is refused too)."""

    __slots__ = ()
    __init__ = __setitem__ = __delitem__ = append = extend = insert = pop = remove = _refuse
    reverse = sort = clear = __iadd__ = __imul__ = _refuse

    def __reduce__(self) -> tuple[Any, ...]:
        return (frozen_list, (list(self),))

    def __copy__(self) -> FrozenList:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> FrozenList:
        return self


def frozen_dict(items: Any = ()) -> FrozenDict:
    """A :class:`FrozenDict` of ``items`` as they are (shallow: freeze the values first)."""
    new: FrozenDict = dict.__new__(FrozenDict)
    dict.update(new, items)
    return new


def frozen_list(items: Any = ()) -> FrozenList:
    """A :class:`FrozenList` of ``items`` as they are (shallow: freeze the values first)."""
    new: FrozenList = list.__new__(FrozenList)
    list.extend(new, items)
    return new


_FROZEN = frozenset({FrozenDict, FrozenList, str, int, float, bool, type(None)})
EMPTY_DICT = frozen_dict()
EMPTY_LIST = frozen_list()


def freeze(value: Any) -> Any:
    """``value`` with every dict and list in it (at any depth) made immutable; values that
    are already frozen (or scalars) are returned as they are, so freezing twice is free."""
    kind = type(value)
    if kind in _FROZEN:
        return value
    if kind is dict or isinstance(value, dict):
        return frozen_dict({k: freeze(v) for k, v in value.items()}) if value else EMPTY_DICT
    if kind is list or isinstance(value, list | tuple):
        return frozen_list([freeze(v) for v in value]) if value else EMPTY_LIST
    return value


def thaw(value: Any) -> Any:
    """A plain, mutable deep copy of a (frozen) JSON value: the caller owns it."""
    if isinstance(value, dict):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, list):
        return [thaw(v) for v in value]
    return value
