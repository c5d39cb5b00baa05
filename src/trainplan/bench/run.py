"""Run the suites, describe the machine, and turn the results into a hardware profile."""

from __future__ import annotations

import datetime
import platform
from pathlib import Path

import numpy as np

from ..errors import PlanError
from . import (
    alignment,
    attention,
    collectives,
    fusion,
    gemm,
    memory,
    recompute,
    tiling,
    triton_support,
)

SUITES = {"gemm": "matmul TFLOP/s by dtype and size",
          "memory": "copy and triad bandwidth, coalesced vs strided reads, pageable vs pinned host copies",
          "alignment": "padded vs unpadded GEMM dimensions",
          "fusion": "bias+GELU+dropout+residual: eager vs torch.compile vs a fused Triton kernel",
          "tiling": "matmul without on-chip reuse vs tiled Triton blocks vs torch.matmul",
          "attention": "materialised softmax(QK^T)V vs Triton FlashAttention vs SDPA, over sequence length",
          "recompute": "activation checkpointing: memory saved vs time spent",
          "collectives": "all-reduce / all-gather / reduce-scatter bus bandwidth (NCCL, or gloo on a CPU)"}
# suites whose run(device, quick, progress) needs nothing else
_PLAIN = {"alignment": alignment, "fusion": fusion, "tiling": tiling, "attention": attention,
          "recompute": recompute, "collectives": collectives}


def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise PlanError("device", "cuda was asked for but torch sees no CUDA device")
    if device not in ("cpu", "cuda"):
        raise PlanError("device", f"must be auto, cpu or cuda (got {device!r})")
    return device


def machine(device: str) -> dict:
    """What the results were measured on."""
    import torch

    info = {"device": device, "torch": torch.__version__, "python": platform.python_version(),
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
    if device == "cuda":
        info.update(name=torch.cuda.get_device_name(), driver_cuda=torch.version.cuda)
    else:
        info.update(name=_cpu_name(), threads=torch.get_num_threads())
    info["host"] = platform.node()
    return info


def _cpu_name() -> str:
    """The CPU model (Linux /proc/cpuinfo), else what the platform reports."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def run_bench(suites: list[str], device: str = "auto", quick: bool = False, gpu: str | None = None,
              progress=None, model: str | None = None, tokens: int = 4096, store=None) -> dict:
    """Run `suites` (default all) and return {"machine", "gpu", <suite>: rows}. `gpu` names the
    catalog accelerator whose datasheet the results are compared against; with `model`, the
    gemm suite also measures that model's GEMM shapes on `tokens` tokens ("gemm_model").
    `store` (a `store.RunWriter`) opens the run before the first suite and keeps each suite's
    rows as the suite finishes, so an interrupted run loses only the suite in progress."""
    try:
        import torch  # noqa: F401
    except ImportError:
        raise PlanError("bench", "needs PyTorch: pip install 'trainplan[torch]'") from None
    unknown = [s for s in suites if s not in SUITES]
    if unknown:
        raise PlanError("suite", f"unknown {', '.join(unknown)}; choose from {', '.join(SUITES)}")
    if tokens < 1:
        raise PlanError("tokens", f"must be a positive number of tokens (got {tokens})")
    spec_model = None
    if model:
        from ..specs import catalog

        spec_model = catalog.model(model)
    device = resolve_device(device)
    if device == "cpu":
        triton_support.prepare_interpreter()
    spec = _gpu_spec(gpu) if gpu else None
    out: dict = {"machine": machine(device), "gpu": spec.name if spec else None, "quick": quick}
    if store is not None:
        store.start(out["machine"], out["gpu"], quick)

    def record(key: str, rows: list[dict]) -> None:
        out[key] = rows
        if store is not None:
            store.suite(key, rows)

    for suite in suites or list(SUITES):
        if suite == "gemm":
            record("gemm", gemm.run(device, quick, dict(spec.peak_tflops) if spec else None, progress))
            record("gemm_k", gemm.run_depth(device, quick, dict(spec.peak_tflops) if spec else None, progress))
            if spec_model:
                rows = gemm.run_model(spec_model, tokens, device, progress=progress)
                peak = spec.peak("bf16") if spec else None
                for row in rows:
                    row["pct_of_peak"] = 100 * row["tflops"] * 1e12 / peak if peak else None
                record("gemm_model", rows)
        elif suite in _PLAIN:
            record(suite, _PLAIN[suite].run(device, quick, progress))
        elif suite == "memory":
            rows = memory.run(device, quick, progress)
            if spec:
                for row in rows:
                    on_device = row["gbs"] is not None and not row["kernel"].startswith("host")
                    row["pct_of_spec"] = 100 * row["gbs"] / (spec.hbm_tbs * 1e3) if on_device else None
            record("memory", rows)
    return out


def _gpu_spec(name: str):
    from ..specs import catalog

    return catalog.gpu(name)  # names the field and lists the known accelerators when unknown


CURVES = ("gemm_curve", "gemm_k_curve", "flash_curve", "gemm_shape")  # profile tables, not fractions


def gemm_shape_from(points: list[dict], peak: float | None) -> dict | None:
    """The GEMM shape fit (estimate/gemm_shape.py) of measured bf16 GEMMs, the square sweep and
    the inner-dimension sweep together: main loop, write-back and kernel time. None with fewer
    than four shapes or two inner dimensions, or when the fit breaks a profile's rules (a
    negative term: timings the form does not describe, as on a CPU): the measured curves then
    stand alone."""
    from ..estimate.gemm_shape import fit_gemm_shape
    from ..profile import gemm_shape_problem

    points = list({(r["m"], r["n"], r["k"]): r for r in points}.values())  # a shape both sweeps ran, once
    if not peak or len(points) < 4 or len({r["k"] for r in points}) < 2:
        return None
    m, n, k, t = (np.array([r[key] for r in points], dtype=float) for key in ("m", "n", "k", "seconds"))
    fit = {key: float(v) for key, v in fit_gemm_shape(m, n, k, t, peak).items()}
    return None if gemm_shape_problem(fit) else {**fit, "points": len(points)}


def profile_from(results: dict) -> dict:
    """Efficiencies for the time model: the best bf16 GEMM (fp32 when bf16 was not run) as a
    fraction of the dense peak of that dtype, the whole square sweep as "gemm_curve" and the
    bf16 inner-dimension sweep as "gemm_k_curve"; the copy bandwidth as a fraction of the
    datasheet HBM bandwidth; SDPA forward + backward at the longest sequence measured as a
    fraction of the peak of its dtype (the time model's FlashAttention efficiency) and at
    every sequence measured as "flash_curve"; and, from
    NCCL runs on two or more GPUs, the largest all-reduce's bus bandwidth as a fraction of
    the one-way scale-up (NVLink) bandwidth per GPU."""
    if not results.get("gpu"):
        raise PlanError("gpu", "a profile compares measurements with a datasheet: name the accelerator with --gpu")
    spec = _gpu_spec(results["gpu"])
    eff: dict = {}
    rows = results.get("gemm") or []
    for dtype in ("bf16", "fp32"):
        points = sorted((r for r in rows if r["dtype"] == dtype), key=lambda r: r["n"])
        peak = spec.peak(dtype)
        if points and peak:
            best = max(points, key=lambda r: r["tflops"])
            eff["gemm"] = best["tflops"] * 1e12 / peak
            if len(points) >= 2:
                eff["gemm_curve"] = {"dtype": dtype, "n": [r["n"] for r in points],
                                     "fraction": [r["tflops"] * 1e12 / peak for r in points]}
            break
    depth = sorted(results.get("gemm_k") or [], key=lambda r: r["k"])
    if len(depth) >= 2 and spec.peak("bf16"):
        eff["gemm_k_curve"] = {"m": depth[0]["m"], "n": depth[0]["n"], "k": [r["k"] for r in depth],
                               "fraction": [r["tflops"] * 1e12 / spec.peak("bf16") for r in depth]}
    shape = gemm_shape_from([r for r in rows if r["dtype"] == "bf16"] + depth, spec.peak("bf16"))
    if shape:
        eff["gemm_shape"] = shape
    copy = [r for r in results.get("memory") or [] if r["kernel"] == "copy"]
    if copy:
        eff["hbm"] = copy[0]["gbs"] * 1e9 / (spec.hbm_tbs * 1e12)
    training = [r for r in results.get("attention") or [] if r["variant"] == "sdpa fwd+bwd" and r["tflops"]]
    if training and spec.peak(training[-1]["dtype"]):
        points = sorted({r["seq"]: r for r in training}.values(), key=lambda r: r["seq"])
        eff["flash"] = points[-1]["tflops"] * 1e12 / spec.peak(points[-1]["dtype"])
        if len(points) >= 2:
            eff["flash_curve"] = {"seq": [r["seq"] for r in points],
                                  "fraction": [r["tflops"] * 1e12 / spec.peak(r["dtype"]) for r in points]}
    reduces = [r for r in results.get("collectives") or [] if r["op"] == "all_reduce" and r["busbw_gbs"]]
    if reduces and results["machine"]["device"] == "cuda" and spec.scale_up_gbs:
        largest = max(reduces, key=lambda r: r["size"])
        eff["nvlink"] = largest["busbw_gbs"] / (spec.scale_up_gbs / 2)
    if not eff:
        raise PlanError("suite", "a profile needs the gemm, memory, attention or (GPU) collectives suite")
    return eff


def _g6(v):
    """A measured fraction to 6 significant digits (what a profile keeps), element-wise."""
    if isinstance(v, dict):
        return {k: _g6(x) for k, x in v.items()}
    return [_g6(x) for x in v] if isinstance(v, list) else float(f"{v:.6g}") if isinstance(v, float) else v


def _table(comment: list[str], name: str | None, values: dict) -> list[str]:
    """Comment lines, then the table as tomli-w writes it (quoting and escaping its strings)."""
    import tomli_w

    body = tomli_w.dumps({name: _g6(values)} if name else _g6(values))
    return [*(f"# {c}" for c in comment), body]


def write_profile(results: dict, path: str) -> dict:
    """Write the profile TOML (atomically: a finished file or none) and return its efficiencies."""
    eff = profile_from(results)
    m = results["machine"]
    lines = _table(["trainplan hardware profile: achieved fractions of the datasheet, measured by `trainplan bench`"],
                   None, {"gpu": results["gpu"], "measured_on": f"{m['name']} ({m['device']}, torch {m['torch']})",
                          "date": m["date"], "source": f"trainplan bench{' --quick' if results.get('quick') else ''}"})
    lines += _table([], "efficiency", {k: v for k, v in eff.items() if k not in CURVES})
    curve = eff.get("gemm_curve")
    if curve:
        lines += _table(["square GEMMs n x n x n: the measured fraction of the dense peak at each size (the time",
                         "model takes from it what tile and wave quantization do not explain)"], "gemm_curve",
                        {"dtype": curve["dtype"], "n": curve["n"], "fraction": curve["fraction"]})
    curve = eff.get("gemm_k_curve")
    if curve:
        lines += _table([f"bf16 {curve['m']} x k x {curve['n']}: the measured fraction of the dense peak at each inner",
                         "dimension k (the time model takes how it changes with k)"], "gemm_k_curve",
                        {"k": curve["k"], "fraction": curve["fraction"]})
    shape = eff.get("gemm_shape")
    if shape:
        lines += _table([f"bf16 GEMM times over {shape['points']} shapes (both sweeps) fitted as 2mnk / R + m·n·b + t0:",
                         "the main loop's fraction of the dense peak, the output write-back as k0 extra inner",
                         f"steps, the fixed time per kernel; {100 * shape['mean_error']:.1f}% mean error. The time model",
                         "prices GEMMs with it."], "gemm_shape",
                        {k: shape[k] for k in ("mainloop", "k0", "overhead_us")})
    curve = eff.get("flash_curve")
    if curve:
        lines += _table(["SDPA (FlashAttention) forward + backward, causal: the measured fraction of the peak at",
                         "each sequence length (the time model interpolates in log length)"], "flash_curve",
                        {"seq": curve["seq"], "fraction": curve["fraction"]})
    target = Path(path)
    if not target.parent.exists():
        raise PlanError("profile", f"directory {target.parent} does not exist")
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text("\n".join(lines))
    tmp.replace(target)
    return eff
