"""Which pipeline engine runs a plan's stages, and what it costs beyond the schedule's
compute: point-to-point transfers per micro-batch on a stage's critical path, and whether the
data-parallel gradient reduction may overlap the backward (conventions.toml [pipeline_engines]).

DeepSpeed's PipelineEngine runs only its TrainSchedule (1F1B), so a plan whose framework runs
its pipeline through it (`deepspeed`), with more than one stage and the 1F1B schedule, is priced
as that engine: blocking sends and receives, one after the other (four transfers per
micro-batch), and the gradients all-reduced after the last backward. Every other plan,
including a `deepspeed` plan asking for a schedule that engine does not have (interleaved,
zero-bubble), is priced with Megatron's schedules: one batched exchange with each neighbour per
micro-batch (two transfers, what `time.stage_times` prices) and the data-parallel overlap it
asks for. Array-friendly in `pp` and `schedule_code`, as the layout search evaluates them.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..plan import conventions
from .memo import Memo
from .pipeline import SCHEDULE_CODE
from .scalars import bools, values, where


@dataclass(frozen=True)
class PipelineEngine:
    name: str
    p2p_transfers_per_micro_batch: float
    dp_reduction_overlapped: bool


_ENGINES = Memo(64)


def engine(name: str) -> PipelineEngine:
    """One engine's convention (one object per engine)."""
    return _ENGINES.get(name, lambda: _engine(name))


def _engine(name: str) -> PipelineEngine:
    conv = conventions()["pipeline_engines"][name]
    return PipelineEngine(name=name, p2p_transfers_per_micro_batch=float(conv["p2p_transfers_per_micro_batch"]),
                          dp_reduction_overlapped=bool(conv["dp_reduction_overlapped"]))


def runs_engine(framework_engine: str, pp, schedule_code):
    """Where the framework's own engine runs the pipeline (True) rather than Megatron's
    schedules: DeepSpeed's with more than one stage and its 1F1B schedule."""
    return bools((values(pp) > 1) & (values(schedule_code) == SCHEDULE_CODE["1f1b"])) & (framework_engine != "megatron")


def pipeline_engine(framework_engine: str, pp: int, schedule: str) -> PipelineEngine:
    """The engine that runs one plan's pipeline (the rule in the module docstring)."""
    own = bool(runs_engine(framework_engine, pp, SCHEDULE_CODE[schedule]))
    return engine(framework_engine if own else "megatron")


def engine_terms(framework_engine: str, pp, schedule_code, overlap_dp):
    """(extra transfers per micro-batch beyond Megatron's two, the data-parallel overlap left),
    array-friendly: what `time.step_from_stages` adds to the pipeline and takes from the overlap."""
    base = engine("megatron")
    own = runs_engine(framework_engine, pp, schedule_code)
    mine = engine(framework_engine)
    extra = where(own, mine.p2p_transfers_per_micro_batch - base.p2p_transfers_per_micro_batch, 0.0)
    overlap = (values(overlap_dp) > 0) & (~own | mine.dp_reduction_overlapped)
    return extra, overlap
