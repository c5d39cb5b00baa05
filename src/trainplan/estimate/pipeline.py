"""Micro-batches whose activations a pipeline stage holds at its memory peak.

Counts follow each schedule's warm-up rule (the number of forwards a stage runs before its
first backward, plus the one in progress):

* GPipe (Huang et al. 2019): all forwards first, so every stage holds all m micro-batches.
* 1F1B (PipeDream-Flush; Narayanan et al. 2021 §2.2.1): stage i (0-based) of p runs
  p - i - 1 warm-up forwards, so it holds min(p - i, m).
* Interleaved 1F1B with v model chunks per stage (Megatron-LM schedules.py,
  `get_num_warmup_microbatches`): (p - i - 1)·2 + (v - 1)·p warm-up chunk-forwards plus one,
  capped at m·v; each chunk holds 1/v of the stage's layers. Stage 0 therefore holds
  L/p·(1 + (p - 1)/(p·v)) layers' worth, Korthikanti et al. 2023 §4.2.3.
* Zero-bubble ZB-H1 (Qi et al. 2024): same activation memory as 1F1B, min(p - i, m).

All functions take numbers or numpy arrays (broadcast together) and return layer-equivalent
micro-batch counts (how many micro-batches' worth of the stage's layers are alive).
"""

from __future__ import annotations

import numpy as np

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb")
SCHEDULE_CODE = {name: i for i, name in enumerate(SCHEDULES)}


def in_flight(schedule_code, stage, pp, micro_batches, vpp=1):
    """Micro-batches' worth of activations stage `stage` holds at its peak."""
    stage, pp, m, v = (np.asarray(x, dtype=float) for x in (stage, pp, micro_batches, vpp))
    one_f_one_b = np.minimum(pp - stage, m)
    chunks = np.minimum((pp - stage - 1) * 2 + (v - 1) * pp + 1, m * v)
    interleaved = chunks / v
    code = np.asarray(schedule_code)
    return np.where(code == 0, m, np.where(code == 2, interleaved, one_f_one_b))


def last_stage_logits_in_flight(schedule_code, micro_batches):
    """Micro-batches whose logits/loss tensors are alive at once on the last stage: the
    last stage runs each backward right after its forward except under GPipe."""
    return np.where(np.asarray(schedule_code) == 0, np.asarray(micro_batches, dtype=float), 1.0)
