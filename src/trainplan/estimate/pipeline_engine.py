"""Which pipeline engine runs a plan's stages, and what it costs beyond the schedule's
compute: point-to-point transfers per micro-batch on a stage's critical path, and whether the
data-parallel gradient reduction may overlap the backward (conventions.toml [pipeline_engines]).

DeepSpeed's PipelineEngine runs only its TrainSchedule (1F1B), so a `deepspeed` plan with more
than one stage and the 1F1B schedule is priced as that engine: blocking sends and receives, one
after the other (four transfers per micro-batch), and the gradients all-reduced after the last
backward. Every other plan, including a `deepspeed` plan asking for a schedule that engine does
not have (interleaved, zero-bubble), is priced with Megatron's schedules: one batched exchange
with each neighbour per micro-batch (two transfers) and the data-parallel overlap it asks for.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..plan import conventions


@dataclass(frozen=True)
class PipelineEngine:
    name: str
    p2p_transfers_per_micro_batch: float
    dp_reduction_overlapped: bool


def pipeline_engine(framework: str, pp: int, schedule: str) -> PipelineEngine:
    """The engine that runs a plan's pipeline (the rule in the module docstring)."""
    name = "deepspeed" if framework == "deepspeed" and pp > 1 and schedule == "1f1b" else "megatron"
    conv = conventions()["pipeline_engines"][name]
    return PipelineEngine(name=name, p2p_transfers_per_micro_batch=float(conv["p2p_transfers_per_micro_batch"]),
                          dp_reduction_overlapped=bool(conv["dp_reduction_overlapped"]))
