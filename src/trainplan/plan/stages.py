"""The pipeline: how a plan's layers are cut into stages (and virtual stages per rank), and the
micro-batches each schedule needs (Megatron-LM, torchtitan, torch.distributed.pipelining and
DualPipe conventions)."""

from __future__ import annotations

import itertools
import math
from functools import lru_cache

from ..errors import PlanError
from ..specs.model import ModelSpec
from .options import Plan


def interleaving_problem(split: list[int], v: int, framework: str) -> str | None:
    """Why `split` (layers per stage) cannot run v virtual stages per rank, or None. Megatron-LM
    (--num-layers-per-virtual-pipeline-stage) needs equal virtual stages; torchtitan
    (pipeline_parallel_layers_per_stage) also allows the first and last virtual stage one layer
    lighter, for the embedding and the head (Llama 3 405B: 126 layers as 7, 8, ..., 8, 7 on 16 x 2,
    or 16 x 8 with the end virtual stages holding only the embedding and the head)."""
    if all(n % v == 0 for n in split):
        return None
    if framework != "megatron" and torchtitan_virtual_stages(split, v):
        return None
    lighter = "" if framework == "megatron" else ", or equal but for a first and last one layer lighter"
    return (f"{v} virtual stages per rank need each stage's layers {split} divisible by {v}{lighter} "
            f"({framework} conventions)")


# torch.distributed.pipelining schedules that run several stages per rank (PyTorch 2.13,
# schedules.py): LoopedBFS and InterleavedZeroBubble any number, ZBVZeroBubble and DualPipeV two
TORCH_MULTI_STAGE = ("looped_bfs", "zb", "zbv", "dualpipev")


def torch_schedule_vpp(schedule: str, vpp: int | None, pp: int) -> int:
    """Stages per rank of a torch multi-stage schedule: --vpp (default 1; zb with 1 is torch's
    ZB1P on one stage per rank), exactly 2 for the V-shaped zbv and dualpipev."""
    if pp < 2:
        raise PlanError("schedule", f"{schedule} needs pp >= 2")
    if schedule in ("zbv", "dualpipev"):
        if vpp not in (None, 2):
            raise PlanError("vpp", f"{schedule} runs exactly 2 stages per rank (V-shaped); got --vpp {vpp}")
        return 2
    if schedule == "looped_bfs" and (vpp or 1) < 2:
        raise PlanError("vpp", "looped_bfs loops over several stages per rank: --vpp >= 2")
    return vpp or 1


def torchtitan_virtual_stages(split: list[int], v: int) -> tuple[int, int] | None:
    """(layers per virtual stage, layers fewer on the first and on the last) for which
    torchtitan's cut of layers + 2 x fewer "weighted" layers into len(split) x v virtual
    stages (rank r holding r, r + pp, ...) gives `split`; None when no such cut does. Every
    virtual stage keeps a layer but the first and last, which may hold only the embedding and
    only the head: Llama 3 405B's one-layer chunks (paper §3.3.2, 126 layers on 16 x 8)."""
    pp, layers = len(split), sum(split)
    for fewer in (0, 1):
        total = layers + 2 * fewer
        if total % (pp * v) or total // (pp * v) < 1:
            continue
        chunks = [total // (pp * v)] * (pp * v)
        chunks[0] -= fewer
        chunks[-1] -= fewer
        if [sum(chunks[r::pp]) for r in range(pp)] == split:
            return total // (pp * v), fewer
    return None


def schedule_batch_rules(plan: Plan, pp: int, m: int) -> None:
    """The micro-batches per step a schedule needs (m), and its interleaving group."""
    if plan.schedule == "interleaved" and m % pp:
        raise PlanError("gbs", f"the interleaved schedule needs micro-batches per step ({m}) divisible by pp ({pp})")
    if plan.pp_group is not None:
        if plan.schedule != "interleaved":
            raise PlanError("pp_group", f"applies to --schedule interleaved only (got {plan.schedule})")
        n = plan.pp_group
        if n > m or n < pp:
            # megatron/core/pipeline_parallel/schedules.py @d98e8a64 (interleaving): with fewer
            # than pp per group the last stage's first backward waits on forwards its warm-up
            # has not run (the order deadlocks; estimate/pipeline_simulation.py simulate)
            raise PlanError("pp_group", f"contiguous micro-batches per virtual stage must lie in [pp={pp}, "
                            f"micro-batches per step={m}]; got {n}")
        if plan.framework == "megatron":
            if 0 < m % n < pp:
                raise PlanError("pp_group", f"the micro-batches per step ({m}) modulo --pp-group ({n}) must be 0 or "
                                f"at least pp ({pp}) (Megatron-Core: otherwise the last group stalls)")
    if plan.framework == "torch" and pp > 1:
        # torch.distributed.pipelining 2.13 (schedules.py): the constructors refuse these
        if plan.schedule == "dualpipev" and m < 2 * pp:
            raise PlanError("gbs", f"torch's ScheduleDualPipeV needs micro-batches ({m}) >= its 2 x pp = {2 * pp} stages")
        if plan.schedule in ("interleaved", "zb") and m % max(1, m // pp):
            raise PlanError("gbs", f"torch's Schedule{'Interleaved1F1B' if plan.schedule == 'interleaved' else 'InterleavedZeroBubble'}"
                            f" needs micro-batches ({m}) divisible by their rounds (max(1, m // pp) = {max(1, m // pp)})")
    if plan.schedule == "dualpipe" and (m < 2 * pp or m % 2):
        # DualPipe.step: "num_chunks % 2 == 0 and num_chunks >= num_ranks * 2"
        raise PlanError("gbs", f"dualpipe needs an even number of micro-batches per step, at least 2 x pp = "
                        f"{2 * pp}; got {m}")


def default_stage_split(layers: int, pp: int) -> list[int]:
    """Even split; when it does not divide, the first and last stages (which also hold the
    embedding and the output head) give up layers first, as Llama 3 405B does
    (126 layers on 16 stages: 7 + 14 x 8 + 7; Llama 3 paper §3.3.2)."""
    per = math.ceil(layers / pp)
    split = [per] * pp
    # The deficit (fewer than pp layers) is taken one layer a stage from the outside in: last,
    # first, second-to-last, second, ...: the j-th stage in that order is pp - 1 - j/2 for even
    # j and (j - 1)/2 for odd j. O(pp).
    for j in range(per * pp - layers):
        split[pp - 1 - j // 2 if j % 2 == 0 else j // 2] -= 1
    return split


def stage_split(plan: Plan, model: ModelSpec, pp: int) -> tuple[int, list[int], list[int], list[int]]:
    """(virtual stages per GPU, layers per stage, dense and MoE layers per stage): the schedule
    and split checked."""
    # -- pipeline
    if pp > model.layers:
        raise PlanError("pp", f"cannot exceed the number of layers ({model.layers}); got {pp}")
    vpp = plan.vpp or 1
    if plan.schedule == "interleaved":
        if pp < 2:
            raise PlanError("schedule", "interleaved needs pp >= 2")
        if plan.vpp is None or plan.vpp < 2:
            raise PlanError("vpp", "the interleaved schedule needs --vpp >= 2 (virtual stages per GPU)")
    elif plan.framework == "torch" and plan.schedule in TORCH_MULTI_STAGE:
        vpp = torch_schedule_vpp(plan.schedule, plan.vpp, pp)
    elif plan.schedule in ("looped_bfs", "zbv", "dualpipev"):
        raise PlanError("schedule", f"{plan.schedule} is torch.distributed.pipelining's schedule: use --framework torch")
    elif plan.framework == "torch" and plan.schedule == "dualpipe":
        # torch.distributed.pipelining 2.13 has no two-copy DualPipe (schedules.py), only DualPipeV
        raise PlanError("schedule", "dualpipe (two copies of the model) is not a torch.distributed.pipelining "
                        "schedule: use dualpipev, its one-copy V-shaped form, or --framework megatron")
    elif plan.vpp not in (None, 1):
        raise PlanError("vpp", f"virtual stages only apply to --schedule interleaved (got {plan.schedule})")
    if plan.schedule == "dualpipe" and (pp < 2 or pp % 2):
        # deepseek-ai/DualPipe dualpipe.py DualPipe.step: "assert num_ranks % 2 == 0"
        raise PlanError("schedule", f"dualpipe needs an even pp >= 2 (its two directions meet in the middle); got {pp}")
    if plan.stage_layers is not None:
        split = list(plan.stage_layers)
        if len(split) != pp:
            raise PlanError("stage_layers", f"needs one entry per pipeline stage ({pp}); got {len(split)}")
        if any(n < 0 for n in split) or sum(split) != model.layers:
            raise PlanError("stage_layers", f"entries must be >= 0 and sum to the layer count "
                            f"({model.layers}); got sum {sum(split)}")
    else:
        split = default_stage_split(model.layers, pp)
    if vpp > 1:
        problem = interleaving_problem(split, vpp, plan.framework)
        if problem:
            raise PlanError("vpp", problem)
    stage_dense, stage_moe = (list(x) for x in _layer_kinds(model.moe_layer_flags, tuple(split)))
    if plan.schedule == "dualpipe":
        # DualPipe keeps two copies of the model: rank r holds stage r of one and stage
        # p - 1 - r of the other (DeepSeek-V3 §3.2.1: "two copies of the model parameters")
        split, stage_moe, stage_dense = ([a + b for a, b in zip(x, x[::-1], strict=True)]
                                         for x in (split, stage_moe, stage_dense))

    return vpp, split, stage_dense, stage_moe


@lru_cache(maxsize=256)
def _layer_kinds(moe_flags: tuple[bool, ...], split: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The dense and the MoE layers of each stage of a split, from the model's MoE flags per layer."""
    bounds = [0, *itertools.accumulate(split)]
    stage_moe = tuple(sum(moe_flags[bounds[i]:bounds[i + 1]]) for i in range(len(split)))
    return tuple(n - m for n, m in zip(split, stage_moe, strict=True)), stage_moe


def pipeline_rules(plan: Plan, model: ModelSpec, pp: int) -> int:
    """The virtual stages per GPU the plan's schedule runs on `pp` stages of the default split,
    checked as `resolve` checks them (a PlanError names the rule broken)."""
    return stage_split(plan.model_copy(update={"stage_layers": None}) if plan.stage_layers else plan, model, pp)[0]
