"""The C heap a search's arrays live on, kept between its steps.

A search makes and drops numpy temporaries of a few hundred kilobytes to a few megabytes each,
thousands of them. glibc's malloc hands the free top of its heap back to the system whenever it
grows past the trim threshold (twice the largest block it has mapped and freed so far; 128 KiB
in a fresh process), and every page handed back costs a page fault (the kernel zeroing it) when
the next temporaries take it again: measured, 1,100 to 2,300 faults per warm search of GPT-3
175B on 1,024 GPUs with glibc's defaults, up to 7,000 with the same work cut into other sizes,
as system time up to a third of the search's CPU time, and varying with what the process did
before (15 to 7,000 for the same code: much of benchmarks/search_speed.py's spread). Raising
the thresholds once (blocks below 16 MiB from the heap, up to 64 MiB of free top kept:
mallopt(3) M_MMAP_THRESHOLD, M_TRIM_THRESHOLD) leaves a warm process with a handful of faults a
search; the process's peak memory does not change (its high-water mark is the same, only kept).
Elsewhere than glibc nothing is changed.
"""

from __future__ import annotations

import os

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc malloc.h
MMAP_THRESHOLD = 16 << 20
TRIM_THRESHOLD = 64 << 20

_STEADY = [False]


def steady_heap() -> None:
    """Raise glibc's trim and mmap thresholds (once per process; nothing elsewhere)."""
    if _STEADY[0]:
        return
    _STEADY[0] = True
    try:
        if not os.confstr("CS_GNU_LIBC_VERSION").startswith("glibc"):
            return
    except (AttributeError, ValueError, OSError):  # (not a GNU system)
        return
    import ctypes

    try:
        libc = ctypes.CDLL(None)
        libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
        libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    except (OSError, AttributeError):
        pass
