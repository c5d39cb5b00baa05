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
        out["gemm_curve"] = {"dtype": str(data["gemm_curve"].get("dtype", "bf16")) if isinstance(
            data["gemm_curve"], dict) else "bf16", **_curve(data["gemm_curve"], "gemm_curve", "n")}
    if "gemm_k_curve" in data:
        out["gemm_k_curve"] = _curve(data["gemm_k_curve"], "gemm_k_curve", "k")
    if "gemm_shape" in data:
        out["gemm_shape"] = _shape(data["gemm_shape"])
    if "flash_curve" in data:
        out["flash_curve"] = _curve(data["flash_curve"], "flash_curve", "seq")
    return out


def profile_accelerator(path: str) -> str | None:
    """The catalog name of the accelerator a profile was measured on (its `gpu` key, which
    `trainplan bench --profile` writes), or None for a profile that names none."""
    from .specs import catalog

    name = read_toml(Path(path), "gpu_profile").get("gpu")
    if name is None:
        return None
    try:
        return catalog.gpu(str(name)).name
    except PlanError as err:
        raise PlanError("gpu_profile", f"{path}: {err.rule}") from None


SHAPE_RULES = {"mainloop": (0.0, 1.5, "a fraction of the dense bf16 peak in (0, 1.5]"),
               "k0": (0.0, 1e6, "inner-dimension steps in [0, 1e6)"),
               "overhead_us": (0.0, 1e4, "microseconds in [0, 1e4)")}


def gemm_shape_problem(table) -> str | None:
    """What makes a fitted GEMM shape (estimate/gemm_shape.py: main loop, write-back k0, kernel
    time) unusable, or None: the rule a profile's [gemm_shape] and a bench fit both meet."""
    if not isinstance(table, dict):
        return "gemm_shape must be a table with mainloop, k0 and overhead_us"
    for key, (low, high, rule) in SHAPE_RULES.items():
        value = table.get(key)
        ok = isinstance(value, int | float) and not isinstance(value, bool) and (
            low < value <= high if key == "mainloop" else low <= value < high)
        if not ok:
            return f"gemm_shape.{key} must be {rule}; got {value!r}"
    return None


def _shape(table) -> dict:
    problem = gemm_shape_problem(table)
    if problem:
        raise PlanError("gpu_profile", problem)
    return {key: float(table[key]) for key in SHAPE_RULES}


def _curve(table, name: str, x: str) -> dict:
    """A measured curve: increasing positive integers `x` (GEMM sizes n, sequence lengths seq)
    and the measured fraction of peak at each."""
    xs, frac = (table.get(k) if isinstance(table, dict) else None for k in (x, "fraction"))
    if not (isinstance(xs, list) and isinstance(frac, list) and len(xs) == len(frac) >= 2):
        raise PlanError("gpu_profile", f"{name} needs lists {x} and fraction of equal length (at least 2)")
    if not all(isinstance(v, int) and v > 0 for v in xs) or any(a >= b for a, b in zip(xs[:-1], xs[1:], strict=True)):
        raise PlanError("gpu_profile", f"{name}.{x} must be increasing positive integers; got {xs}")
    if not all(isinstance(v, int | float) and 0 < v <= 1.5 for v in frac):
        raise PlanError("gpu_profile", f"{name}.fraction values must be numbers in (0, 1.5]; got {frac}")
    return {x: xs, "fraction": [float(v) for v in frac]}
