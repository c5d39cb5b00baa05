"""Evaluate an elementwise formula once per distinct input combination.

A search's layouts repeat few values along some axes (micro-batch, TP, CP, recompute): a GEMM
time or a layer's saved bytes depends only on those, so computing it for 8192 layouts means
computing it for a few dozen combinations and gathering. The formula is applied to the very
same values, so the result is identical to evaluating it on the full arrays.
"""

from __future__ import annotations

import math

import numpy as np

THRESHOLD = 256  # elements: below this, deduplication costs more than it saves


def per_distinct(fn, arrays: dict, **fixed):
    """`fn(**arrays, **fixed)` where `fn` is elementwise in `arrays` (its result, or each value
    of a dict result, has their broadcast shape or is a scalar), computed once per distinct
    combination of the array values."""
    shape = np.broadcast_shapes(*(np.shape(a) for a in arrays.values()))
    size = math.prod(shape)
    if size <= THRESHOLD:
        return fn(**arrays, **fixed)
    flat = {k: np.broadcast_to(np.asarray(v), shape).ravel() for k, v in arrays.items()}
    key = np.zeros(size, dtype=np.int64)
    for values in flat.values():
        distinct, codes = np.unique(values, return_inverse=True)
        key = key * len(distinct) + codes
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    once = fn(**{k: v[first] for k, v in flat.items()}, **fixed)

    def gather(result):
        return np.broadcast_to(np.asarray(result), first.shape)[inverse].reshape(shape)

    return {k: gather(v) for k, v in once.items()} if isinstance(once, dict) else gather(once)
