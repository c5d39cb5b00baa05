"""`trainplan plan --timeline out.png|svg`: the simulated pipeline schedule of one step
(optional extra `plot`: matplotlib)."""

from __future__ import annotations

from .estimate.pipeline import FWD_SHARE, simulate
from .plots import pyplot_for

MAX_MICRO_BATCHES_DRAWN = 64
COLOURS = {"F": "#4C72B0", "B": "#DD8452", "W": "#55A868"}


def drawn_micro_batches(layout, most: int) -> int:
    """The first micro-batches of a step a drawing shows: at most `most`, but DualPipe's whole
    schedule needs at least 2 x pp of them, an even number (DualPipe.step)."""
    m = min(layout.micro_batches, most)
    if layout.plan.schedule == "dualpipe":
        m = min(layout.micro_batches, max(m, 2 * layout.pp))
        m -= m % 2
    return m


def draw_timeline(result, path: str) -> None:
    plt, out = pyplot_for(path, "timeline")
    L, t = result.layout, result.time
    m = drawn_micro_batches(L, MAX_MICRO_BATCHES_DRAWN)
    stage = t["per_microbatch_stage_s"]
    fwd = [x * FWD_SHARE for x in stage]
    bwd = [x * (1 - FWD_SHARE) for x in stage]
    sim = simulate(L.plan.schedule, L.pp, m, fwd, bwd, vpp=L.vpp, group=L.plan.pp_group)
    fig, ax = plt.subplots(figsize=(12, 0.45 * L.pp + 1.6))
    for op in sim.ops:
        ax.barh(op.stage, op.end - op.start, left=op.start, color=COLOURS[op.kind], edgecolor="white", linewidth=0.3)
        if m <= 16 and L.pp <= 16:
            ax.text((op.start + op.end) / 2, op.stage, str(op.mb), ha="center", va="center", fontsize=6, color="white")
    ax.invert_yaxis()
    ax.set_yticks(range(L.pp), [f"stage {i}" for i in range(L.pp)])
    ax.set_xlabel("seconds")
    drawn = f" (first {m} of {L.micro_batches} micro-batches)" if m < L.micro_batches else ""
    ax.set_title(f"{L.model.name}: {L.plan.schedule} schedule, p={L.pp}, m={m}{drawn} — "
                 f"bubble {sim.bubble_fraction:.1%}; forward blue, backward orange, weight-grad green"
                 + (" (DualPipe: both directions)" if L.plan.schedule == "dualpipe" else ""))
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
