"""Calibrated hardware profiles: achieved efficiencies measured on a real accelerator
(`trainplan bench --profile`), used by the time model in place of the catalog defaults."""

from __future__ import annotations

from pathlib import Path

from .errors import PlanError
from .specs.catalog import read_toml

KEYS = {"gemm": "GEMM fraction of dense peak", "flash": "FlashAttention fraction of peak",
        "hbm": "HBM fraction of spec", "nvlink": "NVLink ring busbw fraction", "nic": "NIC fraction"}


def load_profile(path: str) -> dict:
    data = read_toml(Path(path), "gpu_profile")
    eff = data.get("efficiency", data)
    out = {}
    for key in KEYS:
        if key in eff:
            value = eff[key]
            if not isinstance(value, int | float) or not 0 < value <= 1.5:
                raise PlanError("gpu_profile", f"efficiency.{key} must be a number in (0, 1.5]; got {value!r}")
            out[key] = float(value)
    if not out:
        raise PlanError("gpu_profile", f"{path} has no [efficiency] values ({', '.join(KEYS)})")
    return out
