"""Calibrated hardware profiles: achieved efficiencies measured on a real accelerator
(`trainplan bench --profile`), used by the time model in place of the catalog defaults."""

from __future__ import annotations

from pathlib import Path

from .errors import PlanError
from .specs.catalog import read_toml

# The range of a measured fraction of the datasheet. Far below 1: a CPU measured against a GPU's
# datasheet (`bench --device cpu --gpu A100-80GB-SXM` on two busy cores: 1e-4 to 1e-3 for its
# best GEMM, under 1e-6 for a 64 x 64 one); above 1: a clock that beats the datasheet's. Outside
# it a figure is a typo, and the step times it would give (1e-300 -> 1e300 s) meaningless.
MIN_EFFICIENCY, MAX_EFFICIENCY = 1e-6, 1.5
MIN_FRACTION = 1e-9  # a curve's point
EFFICIENCY_RULE = f"a number in [{MIN_EFFICIENCY:g}, {MAX_EFFICIENCY:g}] (a fraction of the datasheet)"


def _number(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


KEYS = {"gemm": "best measured matmul / dense peak (training GEMMs reach the catalog's training share of it)",
        "flash": "FlashAttention forward + backward / peak", "hbm": "HBM fraction of spec",
        "nvlink": "NVLink ring busbw fraction", "nic": "NIC fraction"}


def load_profile(path: str) -> dict:
    data = read_toml(Path(path), "gpu_profile")
    eff = data.get("efficiency", data)
    if not isinstance(eff, dict):
        raise PlanError("gpu_profile", f"{path}: efficiency must be a table ([efficiency] with {', '.join(KEYS)}); "
                        f"got {eff!r:.40}")
    if "gpu" in data and not isinstance(data["gpu"], str):
        raise PlanError("gpu_profile", f"{path}: gpu must be an accelerator's name; got {data['gpu']!r:.40}")
    out = {}
    for key in KEYS:
        if key in eff:
            value = eff[key]
            if not _number(value) or not MIN_EFFICIENCY <= value <= MAX_EFFICIENCY:
                raise PlanError("gpu_profile", f"efficiency.{key} must be {EFFICIENCY_RULE}; got {value!r:.40}")
            out[key] = float(value)
    if not out:
        raise PlanError("gpu_profile", f"{path} has no [efficiency] values ({', '.join(KEYS)})")
    if "gemm_curve" in data:
        dtype = data["gemm_curve"].get("dtype", "bf16") if isinstance(data["gemm_curve"], dict) else "bf16"
        if not isinstance(dtype, str):
            raise PlanError("gpu_profile", f"gemm_curve.dtype must be a dtype's name; got {dtype!r:.40}")
        out["gemm_curve"] = {"dtype": dtype, **_curve(data["gemm_curve"], "gemm_curve", "n")}
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
    if not isinstance(name, str):
        raise PlanError("gpu_profile", f"{path}: gpu must be an accelerator's name; got {name!r:.40}")
    try:
        return catalog.gpu(str(name)).name
    except PlanError as err:
        raise PlanError("gpu_profile", f"{path}: {err.rule}") from None


SHAPE_RULES = {"mainloop": (MIN_EFFICIENCY, MAX_EFFICIENCY,
                            f"a fraction of the dense bf16 peak in [{MIN_EFFICIENCY:g}, {MAX_EFFICIENCY:g}]"),
               "k0": (0.0, 1e6, "inner-dimension steps in [0, 1e6)"),
               "overhead_us": (0.0, 1e4, "microseconds in [0, 1e4)")}


def gemm_shape_problem(table) -> str | None:
    """What makes a fitted GEMM shape (estimate/gemm_shape.py: main loop, write-back k0, kernel
    time) unusable, or None: the rule a profile's [gemm_shape] and a bench fit both meet."""
    if not isinstance(table, dict):
        return "gemm_shape must be a table with mainloop, k0 and overhead_us"
    for key, (low, high, rule) in SHAPE_RULES.items():
        value = table.get(key)
        ok = _number(value) and (low <= value <= high if key == "mainloop" else low <= value < high)
        if not ok:
            return f"gemm_shape.{key} must be {rule}; got {value!r}"
    return None


def _shape(table) -> dict:
    problem = gemm_shape_problem(table)
    if problem:
        raise PlanError("gpu_profile", problem)
    return {key: float(table[key]) for key in SHAPE_RULES}


MAX_SIZE = 1 << 30  # a curve's GEMM size or sequence length


def _is_size(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= MAX_SIZE


def _curve(table, name: str, x: str) -> dict:
    """A measured curve: increasing positive integers `x` (GEMM sizes n, sequence lengths seq)
    and the measured fraction of peak at each."""
    xs, frac = (table.get(k) if isinstance(table, dict) else None for k in (x, "fraction"))
    if not (isinstance(xs, list) and isinstance(frac, list) and len(xs) == len(frac) >= 2):
        raise PlanError("gpu_profile", f"{name} needs lists {x} and fraction of equal length (at least 2)")
    if not all(_is_size(v) for v in xs) or any(a >= b for a, b in zip(xs[:-1], xs[1:], strict=True)):
        raise PlanError("gpu_profile", f"{name}.{x} must be increasing integers from 1 to {MAX_SIZE:,}; got {xs!r:.80}")
    if not all(_number(v) and MIN_FRACTION <= v <= MAX_EFFICIENCY for v in frac):
        raise PlanError("gpu_profile", f"{name}.fraction values must be numbers in [{MIN_FRACTION:g}, "
                        f"{MAX_EFFICIENCY:g}]; got {frac!r:.80}")
    return {x: xs, "fraction": [float(v) for v in frac]}
