"""The whole-run figures of a plan: tokens, steps, time, cost, energy, CO2, goodput."""

from __future__ import annotations

from ..errors import PlanError
from ..plan import Layout, conventions
from .cost import CHINCHILLA_TOKENS_PER_PARAM, goodput, training_run
from .recipe import Recipe, recipe


def training_figures(layout: Layout, step_s: float, r: Recipe | None = None) -> dict:
    """Tokens, steps, time, cost, energy, CO2 and goodput of the run; `r`, the plan's `recipe`
    where the caller has it already."""
    plan, gpu, model = layout.plan, layout.gpu, layout.model
    tr = conventions()["training"]
    tokens = plan.tokens or CHINCHILLA_TOKENS_PER_PARAM * model.params
    # Checkpoint: weights, master weights and optimizer state, written in parallel by the nodes.
    r = r if r is not None else recipe(plan)
    ckpt_bytes = model.params * (r.weight_bytes + r.master_bytes + r.optimizer_bytes)
    nodes = max(1, -(-layout.gpus // plan.gpus_per_node))
    write_s = ckpt_bytes / ((plan.checkpoint_gbs or tr["checkpoint_write_gbs_per_node"]) * 1e9 * nodes)
    mtbf_s = (plan.gpu_mtbf_hours or tr["gpu_mtbf_hours"]) * 3600.0 / layout.gpus
    share = float(goodput(write_s, mtbf_s, tr["restart_minutes"] * 60.0))
    if share <= 0:
        raise PlanError("gpu_mtbf_hours", f"the {layout.gpus}-GPU cluster fails every {mtbf_s:.3g} s on average, "
                        f"too often to checkpoint ({write_s:.3g} s per checkpoint) and restart: the run never "
                        "finishes; raise the MTBF or the checkpoint bandwidth")
    out = training_run(
        tokens=tokens, tokens_per_step=layout.gbs * layout.seq_len, step_s=step_s, gpus=layout.gpus,
        price_per_gpu_hour=plan.price if plan.price is not None else gpu.price_usd_per_hour,
        gpu_power_w=gpu.tdp_w, gpus_per_host=plan.gpus_per_node, host_power_w=tr["host_power_w"],
        pue=plan.pue or tr["pue"], grid_kg_per_kwh=plan.grid_kg_per_kwh if plan.grid_kg_per_kwh is not None
        else tr["grid_kg_per_kwh"], goodput_share=share)
    out.update(checkpoint_bytes=ckpt_bytes, checkpoint_write_s=write_s,
               checkpoint_interval_s=float((2 * write_s * mtbf_s) ** 0.5), cluster_mtbf_h=mtbf_s / 3600.0)
    return out
