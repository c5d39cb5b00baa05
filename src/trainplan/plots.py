"""Search plots (optional extra `plot`: matplotlib): the Pareto front and the largest model
per strategy."""

from __future__ import annotations

from pathlib import Path

from .errors import PlanError
from .units import GiB


def pyplot_for(path: str, field: str):
    """(matplotlib.pyplot, Path) for writing a figure to `path`, or a PlanError naming `field`."""
    out = Path(path)
    if out.suffix.lower() not in (".png", ".svg"):
        raise PlanError(field, f"the file must end in .png or .svg (got {out.name})")
    if not out.parent.exists():
        raise PlanError(field, f"directory {out.parent} does not exist")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlanError(field, "drawing needs matplotlib: pip install 'trainplan[plot]'") from None
    return plt, out


def draw_search_plot(data: dict, path: str, kind: str) -> None:
    plt, out = pyplot_for(path, "plot")
    fig, ax = plt.subplots(figsize=(8, 5))
    if kind == "pareto":
        ax.scatter([x / GiB for x in data["all"]["peak_bytes"]], data["all"]["tokens_per_s"], s=4, alpha=0.3,
                   label="layouts that fit")
        ax.plot([p["peak_bytes"] / GiB for p in data["front"]], [p["tokens_per_s"] for p in data["front"]],
                "o-", color="#b00020", label="Pareto front")
        ax.set_xlabel("peak memory per GPU (GiB)")
        ax.set_ylabel("tokens/s")
        ax.legend()
        ax.set_title("memory vs throughput")
    else:
        names = [r["strategy"] for r in data["results"]]
        params = [r["params"] / 1e9 for r in data["results"]]
        ax.bar(names, params, color="#4c72b0")
        for i, v in enumerate(params):
            ax.text(i, v, f"{v:.1f}B", ha="center", va="bottom")
        ax.set_ylabel("largest trainable model (billion parameters)")
        ax.set_title(f"{data['gpus']} x {data['gpu']}")
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
