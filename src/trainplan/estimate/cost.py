"""A whole training run: tokens, steps, days, GPU-hours, dollars, energy, CO2, and goodput
under failures and checkpointing (DESIGN §3: training time = steps x step time / goodput).

* Tokens default to Chinchilla's compute-optimal 20 tokens per parameter (Hoffmann et al.
  2022).
* Energy = (GPUs x TDP x utilisation + hosts x host power) x time x PUE (the iron law's
  energy corollary, seed 004 Napkin Math 1.11); CO2 = energy x grid intensity.
* Checkpoints every tau = sqrt(2·delta·M) (Young 1974 / Daly 2006) for write time delta and
  cluster mean time between failures M; goodput = 1 - delta/tau - (tau/2 + restart)/M.

Functions take numbers or numpy arrays.
"""

from __future__ import annotations

import numpy as np

from .scalars import floats, maximum, minimum, values

HOURS = 3600.0
CHINCHILLA_TOKENS_PER_PARAM = 20.0


def checkpoint_interval(write_s, mtbf_s):
    """Young/Daly optimum between checkpoints."""
    return np.sqrt(2.0 * floats(write_s) * floats(mtbf_s))


def goodput(write_s, mtbf_s, restart_s=0.0):
    """Share of wall time spent on useful steps with checkpoints at the Young/Daly interval."""
    tau = checkpoint_interval(write_s, mtbf_s)
    lost = values(write_s) / maximum(tau, 1e-12) + (tau / 2 + restart_s) / values(mtbf_s)
    return minimum(maximum(1.0 - lost, 0.0), 1.0)  # np.clip's values, scalars kept out of numpy


def training_run(*, tokens, tokens_per_step, step_s, gpus, price_per_gpu_hour, gpu_power_w,
                 gpus_per_host, host_power_w, pue, grid_kg_per_kwh, utilization=1.0, goodput_share=1.0):
    steps = np.ceil(floats(tokens) / tokens_per_step)
    seconds = steps * step_s / goodput_share
    gpu_hours = seconds / HOURS * gpus
    hosts = np.ceil(floats(gpus) / gpus_per_host)
    power_w = gpus * gpu_power_w * utilization + hosts * host_power_w
    energy_kwh = power_w * seconds / HOURS / 1000.0 * pue
    return {
        "tokens": float(tokens),
        "steps": float(steps),
        "seconds": float(seconds),
        "days": float(seconds / 86400.0),
        "gpu_hours": float(gpu_hours),
        "cost_usd": float(gpu_hours * price_per_gpu_hour) if price_per_gpu_hour is not None else None,
        "energy_kwh": float(energy_kwh),
        "co2_t": float(energy_kwh * grid_kg_per_kwh / 1000.0),
        "goodput": float(goodput_share),
    }
