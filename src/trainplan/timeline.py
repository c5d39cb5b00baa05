"""`trainplan plan --timeline out.png|svg`: the simulated pipeline schedule of one step
(optional extra `plot`: matplotlib)."""

from __future__ import annotations

from .errors import PlanError
from .estimate.pipeline import FWD_SHARE, simulate
from .limits import MAX_TIMELINE_STEPS
from .plots import pyplot_for

MAX_MICRO_BATCHES_DRAWN = 64
COLOURS = {"F": "#4C72B0", "B": "#DD8452", "W": "#55A868"}


# operations a simulated schedule runs per micro-batch, model chunk and stage, weighted by their
# cost: a forward and a backward (ZB-H1: and a deferred weight gradient; DualPipe's, about 2.4
# per micro-batch, measured twice as costly each)
SIMULATION_WEIGHT = {"zb": 3, "dualpipe": 5}


def drawn_micro_batches(layout, most: int) -> int | None:
    """The first micro-batches of a step a drawing shows: at most `most`, but DualPipe's whole
    schedule needs at least 2 x pp of them, an even number (DualPipe.step), and interleaving
    past one group whole groups of its N (pp_group, default pp) micro-batches; and no more than
    MAX_TIMELINE_STEPS allows (each operation of the simulation scans every stage): None when
    even the fewest would cost more."""
    p, v, schedule = layout.pp, layout.vpp, layout.plan.schedule
    m = min(layout.micro_batches, most)
    if schedule == "dualpipe":
        m = min(layout.micro_batches, max(m, 2 * p))
        m -= m % 2
    per_micro_batch = SIMULATION_WEIGHT.get(schedule, 2) * v * p * p
    affordable = MAX_TIMELINE_STEPS // per_micro_batch
    if schedule == "dualpipe":
        return m if m <= affordable else None
    m = min(m, affordable)
    group = layout.plan.pp_group or p
    if schedule == "interleaved" and m > group:
        m -= m % group
    return m or None


def draw_timeline(result, path: str) -> None:
    L, t = result.layout, result.time
    m = drawn_micro_batches(L, MAX_MICRO_BATCHES_DRAWN)
    if m is None:
        raise PlanError("timeline", f"a simulation of {L.pp} pipeline stages is not drawn: it grows with their "
                        f"square, past {MAX_TIMELINE_STEPS:,} steps (about 0.4 s) here")
    plt, out = pyplot_for(path, "timeline")
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
