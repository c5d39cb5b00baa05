"""numpy's element-wise choices (`where`, `maximum`, `minimum`, `any`) that keep one plan's
scalars out of numpy.

The estimators take numbers or numpy arrays: search passes arrays over many layouts, a plan
mostly scalars. numpy prices a call on scalars like one on an array (about a microsecond, a
0-d array out), which is most of one plan's cost; these helpers answer for scalars in Python
with the value numpy would give (the same branch, NaN handled by numpy, and on a tie the
second operand, as numpy's maximum and minimum return it), and hand anything else to numpy.
`floats` turns a scalar into a numpy float64 (whose arithmetic is IEEE double like a 0-d
array's, division by zero included: inf with numpy's warning, never an exception) and an
array-like into a float array, as np.asarray(x, dtype=float) does.
"""

from __future__ import annotations

import numpy as np

# the scalar types a plan's figures come in (a 0-d array is left to numpy)
SCALAR_TYPES = frozenset({bool, int, float, np.bool_, np.float64, np.int64, np.float32, np.int32})


def where(condition, x, y):
    """np.where(condition, x, y); for a scalar condition, x or y itself where that is what numpy
    would give: both scalars, or the one chosen a float array of the result's shape (the other a
    scalar or an array of the same shape)."""
    if condition.__class__ in SCALAR_TYPES:
        if x.__class__ in SCALAR_TYPES and y.__class__ in SCALAR_TYPES:
            return x if condition else y
        chosen, other = (x, y) if condition else (y, x)
        if (chosen.__class__ is np.ndarray and chosen.dtype == np.float64
                and (other.__class__ in SCALAR_TYPES or (other.__class__ is np.ndarray and other.shape == chosen.shape))):
            return chosen
    return np.where(condition, x, y)


def maximum(a, b):
    """np.maximum(a, b); for scalars, the larger (b on a tie, NaN as numpy)."""
    if a.__class__ in SCALAR_TYPES and b.__class__ in SCALAR_TYPES:
        if a > b:
            return a
        if b >= a:
            return b
    return np.maximum(a, b)


def minimum(a, b):
    """np.minimum(a, b); for scalars, the smaller (b on a tie, NaN as numpy)."""
    if a.__class__ in SCALAR_TYPES and b.__class__ in SCALAR_TYPES:
        if a < b:
            return a
        if b <= a:
            return b
    return np.minimum(a, b)


def any_(x) -> bool:
    """bool(np.any(x))."""
    if x.__class__ in SCALAR_TYPES:
        return bool(x)
    return bool(np.any(x))


def floats(x):
    """np.asarray(x, dtype=float), with a scalar as a numpy float64."""
    if x.__class__ in SCALAR_TYPES:
        return np.float64(x)
    return np.asarray(x, dtype=float)


def largest(x) -> float:
    """float(np.max(x)); an array's own max without numpy's Python-level function wrapper."""
    return float(x.max() if x.__class__ is np.ndarray else np.max(x))


def values(x):
    """np.asarray(x), with a scalar left as it is (for comparisons and logic)."""
    if x.__class__ in SCALAR_TYPES:
        return x
    return np.asarray(x)


def bools(x):
    """np.asarray(x, dtype=bool), with a scalar as a numpy bool (whose `~` is logical not)."""
    if x.__class__ in SCALAR_TYPES:
        return np.bool_(x)
    return np.asarray(x, dtype=bool)
