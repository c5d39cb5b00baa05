"""The plan: parallel layout, precision recipe, optimizer, batch, recompute, schedule.

`Plan` (options.py) holds what the user asked for (CLI options, web JSON, Python).
`resolve()` (layout.py) checks it against the model (lookup.py) and the accelerator, derives
what was left out (dp, the global batch, the per-stage layer split: stages.py) and returns a
`Layout` of plain numbers the estimators use. Every rule that can fail raises
`PlanError(field, rule)`.
"""

from ..limits import MAX_BATCH, MAX_GPUS, MAX_SEQ_LEN, MAX_STAGES
from ..specs.conventions import conventions
from .layout import Layout, cluster_links, padded_vocab, resolve
from .lookup import load_model
from .options import (
    DTYPE_BYTES,
    Plan,
    default_zero,
    framework_attention,
    least_zero,
    make_plan,
    te_prefers_cudnn,
    zero_stages,
)
from .stages import (
    TORCH_MULTI_STAGE,
    default_stage_split,
    interleaving_problem,
    pipeline_rules,
    schedule_batch_rules,
    torch_schedule_vpp,
    torchtitan_virtual_stages,
)

__all__ = [
    "DTYPE_BYTES", "MAX_BATCH", "MAX_GPUS", "MAX_SEQ_LEN", "MAX_STAGES", "TORCH_MULTI_STAGE", "Layout", "Plan",
    "cluster_links", "conventions", "default_stage_split", "default_zero", "framework_attention",
    "interleaving_problem", "least_zero", "load_model", "make_plan", "padded_vocab", "pipeline_rules", "resolve",
    "schedule_batch_rules", "te_prefers_cudnn", "torch_schedule_vpp", "torchtitan_virtual_stages", "zero_stages",
]

# `from trainplan import plan` is also the Python API's function (trainplan/api.py)
from ..api import make_callable  # noqa: E402

make_callable(__name__)
