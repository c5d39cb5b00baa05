"""Calibrated hardware profiles: achieved efficiencies measured on a real accelerator
(`trainplan bench --profile`), used by the time model in place of the catalog defaults."""

from __future__ import annotations

from pathlib import Path

from .errors import PlanError
from .specs.catalog import read_toml

KEYS = {"gemm": "best measured matmul / dense peak (training GEMMs reach the catalog's training share of it)",
        "flash": "FlashAttention forward + backward / peak", "hbm": "HBM fraction of spec",
        "nvlink": "NVLink ring busbw fraction", "nic": "NIC fraction"}


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
    if "gemm_curve" in data:
        out["gemm_curve"] = _gemm_curve(data["gemm_curve"])
    return out


def _gemm_curve(table) -> dict:
    """[gemm_curve]: square sizes n (increasing) and the measured fraction of peak at each."""
    n, frac = (table.get(k) if isinstance(table, dict) else None for k in ("n", "fraction"))
    if not (isinstance(n, list) and isinstance(frac, list) and len(n) == len(frac) >= 2):
        raise PlanError("gpu_profile", "gemm_curve needs lists n and fraction of equal length (at least 2)")
    if not all(isinstance(x, int) and x > 0 for x in n) or any(a >= b for a, b in zip(n[:-1], n[1:], strict=True)):
        raise PlanError("gpu_profile", f"gemm_curve.n must be increasing positive integers; got {n}")
    if not all(isinstance(x, int | float) and 0 < x <= 1.5 for x in frac):
        raise PlanError("gpu_profile", f"gemm_curve.fraction values must be numbers in (0, 1.5]; got {frac}")
    return {"dtype": str(table.get("dtype", "bf16")), "n": n, "fraction": [float(x) for x in frac]}
