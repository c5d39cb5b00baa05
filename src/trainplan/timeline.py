"""`trainplan plan --timeline out.png|svg`: the simulated pipeline schedule of one step
(optional extra `plot`: matplotlib)."""

from __future__ import annotations

from .errors import PlanError
from .estimate.pipeline import FWD_SHARE
from .estimate.pipeline_simulation import simulate
from .estimate.torch_schedules import TORCH_CLASSES, stage_ranks
from .limits import MAX_TIMELINE_STEPS
from .plots import pyplot_for

MAX_MICRO_BATCHES_DRAWN = 64
COLOURS = {"F": "#4C72B0", "B": "#DD8452", "I": "#C44E52", "W": "#55A868"}


# operations a simulated schedule runs per micro-batch, model chunk and stage, weighted by their
# cost: a forward and a backward (ZB-H1, and torch's zero-bubble schedules: and a split-off
# weight gradient; DualPipe's, about 2.4 per micro-batch, measured twice as costly each)
SIMULATION_WEIGHT = {"zb": 3, "dualpipe": 5, "zbv": 3, "dualpipev": 3}


def runs_torch_order(layout) -> bool:
    """Whether the plan's schedule is simulated in torch.distributed.pipelining's own order."""
    return layout.plan.framework == "torch" and layout.plan.schedule in TORCH_CLASSES


def simulate_layout(layout, m: int, stage_s):
    """The simulated step of a plan's first m micro-batches, its stages' per-micro-batch times
    split into forward and backward at the time model's shares."""
    framework = "torch" if runs_torch_order(layout) else None
    return simulate(layout.plan.schedule, layout.pp, m, [x * FWD_SHARE for x in stage_s],
                    [x * (1 - FWD_SHARE) for x in stage_s], vpp=layout.vpp, group=layout.plan.pp_group,
                    framework=framework)


def row_labels(layout) -> list[str]:
    """'stage i', or under torch's schedules with several stages per rank 'rank i: stages a, b'."""
    p, name = layout.pp, layout.plan.schedule
    if runs_torch_order(layout) and layout.vpp > 1:
        return [f"rank {i}: stages {', '.join(map(str, s))}" for i, s in enumerate(stage_ranks(name, p, layout.vpp))]
    return [f"stage {i}" for i in range(p)]


def drawn_micro_batches(layout, most: int) -> int | None:
    """The first micro-batches of a step a drawing shows: at most `most`, but DualPipe's whole
    schedule needs at least 2 x pp of them, an even number (DualPipe.step), and interleaving
    past one group whole groups of its N (pp_group, default pp) micro-batches; and no more than
    MAX_TIMELINE_STEPS allows (each operation of the simulation scans every stage): None when
    even the fewest would cost more."""
    p, v, schedule = layout.pp, layout.vpp, layout.plan.schedule
    torch = runs_torch_order(layout)
    m = min(layout.micro_batches, most)
    if schedule in ("dualpipe", "dualpipev"):
        m = min(layout.micro_batches, max(m, 2 * p))
        m -= m % 2 if schedule == "dualpipe" else 0
    per_micro_batch = SIMULATION_WEIGHT.get(schedule, 2) * v * p * p
    affordable = MAX_TIMELINE_STEPS // per_micro_batch
    if schedule in ("dualpipe", "dualpipev"):
        return m if m <= affordable else None
    m = min(m, affordable)
    group = p if torch else (layout.plan.pp_group or p)
    if (schedule == "interleaved" or (torch and schedule == "zb")) and m > group and m < layout.micro_batches:
        m -= m % group  # torch's rounds of m // max(1, m // p) must divide m: a multiple of p does
    return m or None


def draw_timeline(result, path: str) -> None:
    L, t = result.layout, result.time
    m = drawn_micro_batches(L, MAX_MICRO_BATCHES_DRAWN)
    if m is None:
        raise PlanError("timeline", f"a simulation of {L.pp} pipeline stages is not drawn: it grows with their "
                        f"square, past {MAX_TIMELINE_STEPS:,} steps (about 0.4 s) here")
    plt, out = pyplot_for(path, "timeline")
    sim = simulate_layout(L, m, t["per_microbatch_stage_s"])
    fig, ax = plt.subplots(figsize=(12, 0.45 * L.pp + 1.6))
    for op in sim.ops:
        # a rank's later chunks (stages) paler than its first
        ax.barh(op.stage, op.end - op.start, left=op.start, color=COLOURS[op.kind], edgecolor="white", linewidth=0.3,
                alpha=1.0 - 0.4 * (op.chunk % 2) if sim.vpp > 1 else 1.0)
        if m <= 16 and L.pp <= 16:
            ax.text((op.start + op.end) / 2, op.stage, str(op.mb), ha="center", va="center", fontsize=6, color="white")
    ax.invert_yaxis()
    ax.set_yticks(range(L.pp), row_labels(L))
    ax.set_xlabel("seconds")
    drawn = f" (first {m} of {L.micro_batches} micro-batches)" if m < L.micro_batches else ""
    order = f"torch.distributed.pipelining {TORCH_CLASSES[L.plan.schedule]}" if runs_torch_order(L) else \
        f"{L.plan.schedule} schedule"
    ax.set_title(f"{L.model.name}: {order}, p={L.pp}, m={m}{drawn} — bubble {sim.bubble_fraction:.1%}\n"
                 "forward blue, backward orange, input-gradient half red, weight-gradient half green"
                 + ("; a rank's second stage paler" if sim.vpp > 1 else "")
                 + (" (DualPipe: both directions)" if L.plan.schedule == "dualpipe" else ""), fontsize=9)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
