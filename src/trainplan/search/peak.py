"""Each layout's peak memory from the memory grid's terms (`bulk`): the largest over its
representative stages of what a stage holds at one micro-batch in flight, plus what each
further micro-batch, output head and loss in flight adds."""

from __future__ import annotations

import numpy as np


def row_max(a: np.ndarray) -> np.ndarray:
    """The largest of each column of a few long rows, row by row (numpy's reduction over the
    first axis walks it column by column)."""
    out = a[0]
    for row in a[1:]:
        out = np.maximum(out, row)
    return out


# layouts whose memory totals are worked out at a time: their temporaries (a few stages x this
# many floats each) stay in the cache
SLICE = 1 << 15


def peaks(per_cell: dict[str, np.ndarray], cell: np.ndarray, inflight: np.ndarray, heads: np.ndarray,
          logits: np.ndarray, key: np.ndarray) -> np.ndarray:
    """Each layout's peak memory, the largest over its stages of total + per in-flight micro-batch
    x (in flight - 1) + per logits x (heads - 1) + per loss x (logits - heads): `per_cell` the
    terms per stage and cell (`bulk._per_cell`), the counts per stage and key (`bulk._in_flight`). The last
    two terms, zero where the last stage holds one micro-batch's heads and logits (all schedules
    but GPipe), are added only where they are not (the same sums where the terms are finite)."""
    base, per_mb, per_logits, per_loss = (per_cell[k] for k in ("total", "total_per_in_flight", "total_per_logits",
                                                                "total_per_loss"))
    more_mb, more_heads, more_logits = inflight - 1, heads - 1, logits - heads
    zero = (more_heads == 0) & (more_logits == 0)
    if not (np.isfinite(per_logits).all() and np.isfinite(per_loss).all()):
        zero[:] = False  # (inf x 0 is NaN)
    peak = np.empty(len(key))
    for lo in range(0, len(key), SLICE):
        part = slice(lo, lo + SLICE)
        k, c = key[part], cell[part]
        # (stages x layouts: a row per stage, so the peak is a maximum of a few long rows)
        total = np.take(base, c, axis=1) + np.take(per_mb, c, axis=1) * np.take(more_mb, k, axis=1)
        odd = np.flatnonzero(~zero[k])
        if len(odd):
            k, c = k[odd], c[odd]
            total[:, odd] = total[:, odd] + np.take(per_logits, c, axis=1) * more_heads[k] \
                + np.take(per_loss, c, axis=1) * more_logits[k]
        peak[part] = row_max(total)
    return peak
