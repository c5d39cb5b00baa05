"""Where a pipeline schedule places the model's stages on the ranks, and so which ranks hold
the embedding and the output head (the one rule the memory, the step time and the search read).

* PLAIN: one stage per rank in order (or looped, v per rank): rank 0 holds the embedding, rank
  p - 1 the output head.
* FOLDED (DualPipe, DeepSeek-V3, arXiv 2412.19437 §3.2.1): two copies of the model in opposite directions, rank r
  holding stages r and p - 1 - r, so both end ranks hold the embedding and the head for memory;
  the step time counts each once, on rank 0 and rank p - 1.
* V_SHAPE (torch's "v" stage-to-rank style, `torch_schedules.V_SHAPED`): rank i holds stages i
  and 2p - 1 - i, so rank 0 holds both the first and the last stage.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from .torch_schedules import V_SHAPED

PLAIN, FOLDED, V_SHAPE = 0, 1, 2


def placement(schedule: str, framework: str) -> int:
    """The placement (PLAIN, FOLDED or V_SHAPE) of a schedule run by `framework`."""
    if schedule == "dualpipe":
        return FOLDED
    if framework == "torch" and schedule in V_SHAPED:
        return V_SHAPE
    return PLAIN


def rank_ends(place: int, rank: int, pp: int) -> tuple[bool, bool, bool, bool]:
    """Whether pipeline rank `rank` of `pp` holds the embedding and the output head for memory,
    then for the step time, under placement `place`."""
    first, last = rank == 0, rank == pp - 1
    if place == FOLDED:
        return first or last, first or last, first, last
    if place == V_SHAPE:
        return first, first, first, first
    return first, last, first, last


@lru_cache(maxsize=256)
def ends(place: int, pp: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """`rank_ends` of every rank, as four float arrays over the ranks (1.0 where it holds it;
    read-only)."""
    out = tuple(np.array(column, dtype=float) for column in zip(*(rank_ends(place, s, pp) for s in range(pp)),
                                                                 strict=True))
    for a in out:
        a.flags.writeable = False
    return out
