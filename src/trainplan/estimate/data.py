"""The input pipeline: how long a data-parallel rank needs to read, tokenize and copy to the
GPU the tokens of one step, and whether that, not the model, sets the step time.

Seed 004 (eqs. 7-11): the pipeline's rate is the slowest of storage, preprocessing and the
host->device copy, and the accelerator waits when that is slower than compute. Its
Example 1.1 (GPT-2 on V100, 32 x 1024 tokens per batch): one BPE worker at 500K tokens/s
needs 65.5 ms, the int64 batch (262 KB) crosses PCIe Gen3 x16 (15.75 GB/s) in 0.017 ms, and
without prefetching the ~84 ms step runs at about 56% utilization.

All functions take numbers or arrays (DESIGN §2).
"""

from __future__ import annotations

import functools

import numpy as np

from ..specs.conventions import conventions
from .scalars import floats, maximum

TOKEN_ID_BYTES = 8  # the batch crosses to the GPU as int64 token ids (PyTorch's default index dtype)


def data_stage_seconds(tokens, *, bytes_per_token, storage_gbs, workers, tokenize_rate, h2d_gbs) -> dict:
    """Seconds per step of each input-pipeline stage for `tokens` tokens on one data-parallel
    rank. A stage given as None (no storage limit, pre-tokenized data) takes no time."""
    tokens = floats(tokens)
    zero = 0.0 if tokens.__class__ is np.float64 else np.zeros_like(tokens)
    return {
        "storage": zero if storage_gbs is None else tokens * bytes_per_token / (storage_gbs * 1e9),
        "tokenize": zero if tokenize_rate is None else tokens / (workers * tokenize_rate),
        "host_to_device": tokens * TOKEN_ID_BYTES / (h2d_gbs * 1e9),
    }


def data_seconds(stages: dict, prefetch: bool):
    """Input time per step: with prefetching the stages run concurrently on successive batches,
    so the slowest sets the pace; without, they run one after another."""
    values = list(stages.values())
    if not prefetch:
        return sum(values)
    return functools.reduce(maximum, values)  # the largest (element-wise for search's arrays)


def step_with_data(busy, data, prefetch: bool):
    """The step given the accelerator's own time `busy` and the input time `data`: prefetching
    overlaps them (the slower wins), a serial loader adds them."""
    return maximum(busy, data) if prefetch else busy + data


def data_options(plan, model) -> dict:
    """The plan's input-pipeline settings with the documented defaults (conventions.toml [data])
    filled in: raw text is read at about 4 bytes per token, token ids at 2 bytes (uint16) when
    the vocabulary fits, else 4."""
    d = conventions()["data"]
    ids_bytes = 2.0 if model.vocab <= 65536 else 4.0
    per_token = plan.data_bytes_per_token or (d["raw_text_bytes_per_token"] if plan.tokenize_rate else ids_bytes)
    return {"bytes_per_token": per_token, "storage_gbs": plan.storage_gbs,
            "workers": plan.data_workers or d["workers"], "tokenize_rate": plan.tokenize_rate,
            "h2d_gbs": plan.h2d_gbs or d["h2d_gbs"]}


def data_step_seconds(plan, model, tokens_per_rank):
    """Input time per step for `tokens_per_rank` tokens on each data-parallel rank."""
    return data_seconds(data_stage_seconds(tokens_per_rank, **data_options(plan, model)), plan.prefetch)


def data_report(plan, model, tokens_per_rank: float) -> dict:
    """Each input stage's seconds per step on one data-parallel rank, for the plan report."""
    stages = data_stage_seconds(tokens_per_rank, **data_options(plan, model))
    return {**{k: float(v) for k, v in stages.items()}, "prefetch": plan.prefetch,
            "per_step_s": float(data_seconds(stages, plan.prefetch))}
