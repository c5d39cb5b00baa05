"""Memoisation of one plan's derived constants, for the evaluations that ask for the same ones
again (the explorer's plans, a report after its plan, repeated plans in process): each cache is
bounded and keyed on everything its figures are computed from, catalog data included (the
conventions' parse is one object per catalog change: `specs.index.catalog_files`).
"""

from __future__ import annotations

import sys
from dataclasses import fields
from operator import attrgetter

import numpy as np

# (the module, not its catalog_files: a cached function here would be taken for an estimator's memo)
from ..specs import index as catalog_index

_ALL: list = []  # every memo of the estimators: `clear_all` empties them


def track(cache):
    """Register a cache (a dict, an lru_cache-wrapped function or a `Memo`) for `clear_all`;
    returns it."""
    _ALL.append(cache)
    return cache


def clear_all() -> int:
    """Empty every memo of the estimators and the report: those registered here and every
    `functools.lru_cache` function of a loaded `trainplan.estimate.*` or `trainplan.report`
    module (a cold plan, as the first in a process prices it). Returns how many it emptied."""
    caches = {id(c): c for c in _ALL}
    for name, module in list(sys.modules.items()):
        if name.startswith("trainplan.estimate.") or name == "trainplan.report":
            for value in vars(module).values():
                if callable(getattr(value, "cache_clear", None)):
                    caches[id(value)] = value
    for cache in caches.values():
        (getattr(cache, "cache_clear", None) or cache.clear)()
    return len(caches)


def cached_hash(obj) -> int:
    """The hash of a frozen dataclass's field values, computed once per object (the memoised
    estimators look it up as part of their keys several times per plan)."""
    h = obj.__dict__.get("_fields_hash")
    if h is None:
        cls = obj.__class__
        get = _FIELD_GETTERS.get(cls)
        if get is None:
            get = _FIELD_GETTERS[cls] = _field_values(cls)
        h = hash(get(obj))
        object.__setattr__(obj, "_fields_hash", h)
    return h


_FIELD_GETTERS: dict = {}  # dataclass -> its field values' getter (a class's fields do not change)


def _field_values(cls):
    """A function giving a dataclass instance's field values as one tuple, in field order."""
    names = [f.name for f in fields(cls)]
    if len(names) > 1:
        return attrgetter(*names)
    return lambda obj: tuple(getattr(obj, name) for name in names)


class Unhashable(TypeError):
    """A `Memo` key that cannot be hashed."""


class Memo:
    """A bounded dict of computed values that starts afresh when the catalog's conventions
    change or when it is full."""

    def __init__(self, maxsize: int = 256):
        self.maxsize = maxsize
        self.values: dict = {}
        self.conventions = None
        track(self)

    def clear(self) -> None:
        self.values = {}

    def get(self, key, compute):
        conv = catalog_index.catalog_files()["conventions.toml"]  # (`conventions()`, without its two calls)
        if conv is not self.conventions:
            self.values, self.conventions = {}, conv
        try:
            value = self.values.get(key)
        except TypeError as exc:  # an unhashable key: told apart from an error of `compute`
            raise Unhashable from exc
        if value is None:
            value = compute()
            if len(self.values) >= self.maxsize:
                self.values.clear()
            self.values[key] = value
        return value


class SameObjects:
    """Values computed from particular objects (a memo's read-only arrays and the numbers beside
    them, which a memoised plan hands out again), found again while the same objects come back:
    keyed on a key and the objects' ids. An entry holds its objects, so no id is reused while it
    lives (the same ids are the same objects), and serves only while every array among them is
    read-only (one made writeable may have changed since); objects with a writeable array are
    not memoised. Bounded: emptied when full."""

    def __init__(self, maxsize: int = 64):
        self.maxsize = maxsize
        self.entries: dict = {}
        track(self)

    def clear(self) -> None:
        self.entries = {}

    def get(self, key, objects: tuple, compute):
        ids = (key, *map(id, objects))
        entry = self.entries.get(ids)
        if entry is not None and not any_writeable(entry[1]):
            return entry[2]
        value = compute()
        arrays = [o for o in objects if o.__class__ is np.ndarray]
        if not any_writeable(arrays):
            if len(self.entries) >= self.maxsize:
                self.entries.clear()
            self.entries[ids] = (objects, arrays, value)
        return value


def any_writeable(arrays: list) -> bool:
    """Whether any of `arrays` is writeable."""
    for a in arrays:
        if a.flags.writeable:
            return True
    return False


def read_only(value):
    """`value`, to keep in a memo, with its numpy arrays (in its dicts and tuples, nested ones
    included) made read-only in place (`fresh_copy` hands each caller dicts of its own around
    them, knowing from here which of a dict's entries are dicts)."""
    cls = value.__class__
    if cls is np.ndarray:
        value.flags.writeable = False
    elif cls is dict or cls is tuple:
        nested = []
        for k, v in (value.items() if cls is dict else enumerate(value)):
            c = v.__class__
            if c is np.ndarray:
                v.flags.writeable = False
            elif c is dict or c is tuple:
                read_only(v)
                nested.append(k)
        if cls is dict:
            if len(_NESTED) >= 1024:
                _NESTED.clear()
            _NESTED[id(value)] = (value, tuple(k for k in nested if value[k].__class__ is dict))
    return value


# a memoised dict's id -> (the dict, its keys holding dicts), from `read_only` (the entry holds the
# dict, so no id is reused; a memoised value is never changed in place)
_NESTED: dict = track({})


def fresh_copy(value):
    """A memoised value's dicts, nested ones included, copied for one caller (numbers and the
    read-only arrays shared)."""
    if value.__class__ is dict:
        found = _NESTED.get(id(value))
        if found is not None and found[0] is value:
            out = value.copy()
            for k in found[1]:
                out[k] = fresh_copy(out[k])
            return out
        return {k: fresh_copy(v) if v.__class__ is dict else v for k, v in value.items()}
    return value


def array_key(args: tuple, max_size: int = 64, checked: bool = True):
    """A hashable key for a memo over `args` (an array as its shape, dtype and bytes; a dict as
    its items); None where one is an array of more than `max_size` entries (search's layouts at
    once) or, `checked`, is not hashable (unchecked, a `Memo` raises `Unhashable` for it)."""
    parts = []
    for v in args:
        cls = v.__class__
        if cls is np.ndarray:
            if v.size > max_size:
                return None
            v = (v.shape, v.dtype.str, v.tobytes())
        elif cls is dict:
            v = tuple(v.items())
        parts.append(v)
    key = tuple(parts)
    if checked:
        try:
            hash(key)
        except TypeError:
            return None
    return key


def scalar_call(memo: Memo, fn, *args):
    """fn(*args), memoised in `memo` where no argument is an array (one plan's numbers, names
    and frozen records such as the accelerator and the recipe), computed afresh where one is
    (search's layouts) or is not hashable."""
    for a in args:
        if a.__class__ is np.ndarray:
            return fn(*args)
    key = (fn, *args)
    try:
        return memo.get(key, lambda: fn(*args))
    except Unhashable:
        return fn(*args)
