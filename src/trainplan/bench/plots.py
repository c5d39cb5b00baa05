"""Figures of a bench run (optional extra `plot`): the GEMM efficiency curve, a roofline with
the measured points, attention time and memory over sequence length, and the recompute trade."""

from __future__ import annotations

from ..plots import pyplot_for
from .gemm import torch_dtype


def _elem_bytes(dtype: str) -> int:
    return torch_dtype(dtype).itemsize


def draw_bench_plot(results: dict, path: str) -> None:
    """One PNG/SVG with a panel per measured suite that has a figure."""
    attention = results.get("attention") or []
    available = {"gemm": bool(results.get("gemm")),
                 "roofline": bool(results.get("gemm") and results.get("memory")),
                 "attention time": any(r["seconds"] for r in attention),
                 "attention memory": any(r["peak_bytes"] for r in attention),
                 "recompute": bool(results.get("recompute"))}
    panels = [p for p, ok in available.items() if ok]
    if not panels:
        from ..errors import PlanError

        raise PlanError("plot", "nothing to draw: run the gemm, memory, attention or recompute suite")
    plt, out = pyplot_for(path, "plot")
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.5), squeeze=False)
    for ax, panel in zip(axes[0], panels, strict=True):
        if panel == "gemm":
            _gemm_panel(ax, results)
        elif panel == "roofline":
            _roofline_panel(ax, results)
        elif panel.startswith("attention"):
            _attention_panel(ax, attention, "seconds" if panel.endswith("time") else "peak_bytes")
        else:
            _recompute_panel(ax, results)
    m = results["machine"]
    fig.suptitle(f"{m['name']} ({m['device']}, torch {m['torch']})", fontsize=10)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


def _gemm_panel(ax, results):
    rows = results["gemm"]
    for dtype in dict.fromkeys(r["dtype"] for r in rows):
        pts = [r for r in rows if r["dtype"] == dtype]
        ax.plot([r["n"] for r in pts], [r["tflops"] for r in pts], "o-", label=dtype)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("square GEMM size n")
    ax.set_ylabel("TFLOP/s")
    ax.set_title("GEMM efficiency curve")
    ax.legend()


def _roofline_panel(ax, results):
    """Roofs from the measurements: the best GEMM (compute) and the copy bandwidth (memory).
    A square n GEMM does 2n³ FLOPs on 3n² elements: intensity 2n / (3 · bytes per element)."""
    bandwidth = next(r["gbs"] for r in results["memory"] if r["kernel"] == "copy") * 1e9
    peak = max(r["tflops"] for r in results["gemm"]) * 1e12
    pts = [(2 * r["n"] / (3 * _elem_bytes(r["dtype"])), r["tflops"] * 1e12, r["dtype"]) for r in results["gemm"]]
    lo, hi = min(p[0] for p in pts) / 4, max(p[0] for p in pts) * 4
    ridge = peak / bandwidth
    xs = [lo, max(lo, min(ridge, hi)), hi]
    ax.plot(xs, [min(peak, bandwidth * x) / 1e12 for x in xs], "k-", label="measured roofs")
    for dtype in dict.fromkeys(p[2] for p in pts):
        sel = [p for p in pts if p[2] == dtype]
        ax.scatter([p[0] for p in sel], [p[1] / 1e12 for p in sel], label=f"GEMM {dtype}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("TFLOP/s")
    ax.set_title(f"roofline (ridge {ridge:.1f} FLOP/byte)")
    ax.legend()


def _recompute_panel(ax, results):
    rows = results["recompute"]
    names = [r["recompute"] for r in rows]
    x = range(len(rows))
    ax.bar([i - 0.2 for i in x], [r["activation_ratio"] for r in rows], width=0.4, label="activation bytes")
    ax.bar([i + 0.2 for i in x], [r["time_ratio"] for r in rows], width=0.4, label="step time")
    ax.set_xticks(list(x), names)
    ax.set_ylabel("relative to no recompute")
    ax.set_title("recompute: memory for time")
    ax.legend()


def _attention_panel(ax, rows, key: str):
    """Time (ms) or peak memory above the inputs (MiB) against sequence length, per variant."""
    scale = 1e3 if key == "seconds" else 1 / 2**20
    for variant in dict.fromkeys(r["variant"] for r in rows):
        pts = [r for r in rows if r["variant"] == variant and r[key]]
        if pts:
            ax.plot([r["seq"] for r in pts], [r[key] * scale for r in pts], "o-", label=variant)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length (batch x seq constant)")
    ax.set_ylabel("ms" if key == "seconds" else "peak MiB above inputs")
    ax.set_title("attention " + ("time" if key == "seconds" else "memory"))
    ax.legend()
