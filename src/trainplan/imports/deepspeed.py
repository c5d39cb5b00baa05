"""DeepSpeed JSON configurations (deepspeed.ai/docs/config-json) as plans.

A DeepSpeed configuration says how a model is trained, not which: the model comes with it
(--model, a catalog name or a Hugging Face org/name in the local cache, or --hf-config).
Keys and defaults are DeepSpeed's (deepspeed/runtime/config.py, zero/config.py at 0.19):
overlap_comm is on by default only for ZeRO-3, "Adam" is AdamW unless adam_w_mode is false,
and a value of "auto" (the Hugging Face Trainer fills it in) is left to trainplan's default
and said so.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from ..errors import PlanError
from . import Imported, bad, defaults

NOT_PLANNED = {
    "steps_per_print", "wall_clock_breakdown", "scheduler", "zero_allow_untested_optimizer", "prescale_gradients",
    "gradient_predivide_factor", "flops_profiler", "tensorboard", "wandb", "csv_monitor", "comms_logger",
    "dump_state", "memory_breakdown", "checkpoint", "data_efficiency", "seed", "elasticity",
    "monitor_config", "train_micro_batch_size_per_gpu_auto", "aio", "nebula", "amp", "sparse_gradients",
    "zero_force_ds_cpu_optimizer",
}
ZERO_NOT_PLANNED = {"contiguous_gradients", "gather_16bit_weights_on_model_save", "stage3_gather_16bit_weights_on_model_save",
                    "round_robin_gradients", "load_from_fp32_weights", "elastic_checkpoint", "ignore_unused_parameters",
                    "legacy_stage1", "sub_group_size", "memory_efficient_linear", "cpu_offload"}
DTYPES = {"fp32": "fp32", "fp16": "fp16", "bf16": "bf16", "bfp16": "bf16"}


def _auto(v) -> bool:
    return isinstance(v, str) and v.lower() == "auto"


def _int(cfg: dict, key: str, where: str = "") -> int | None:
    v = cfg.get(key)
    if v is None or _auto(v):
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise bad(f"{where}{key}", f"must be a positive integer or \"auto\" (got {v!r:.40})")
    return v


def _enabled(section) -> bool | None:
    """A {"enabled": ...} section: True, False, or None for "auto"."""
    if section is None:
        return False
    if not isinstance(section, dict):
        raise bad("bf16", f"must be an object such as {{\"enabled\": true}} (got {section!r:.40})")
    v = section.get("enabled", False)
    if _auto(v):
        return None
    if not isinstance(v, bool):
        raise bad("enabled", f"must be true, false or \"auto\" (got {v!r:.40})")
    return v


def _optimizer(cfg: dict, out: dict, notes: list[str]) -> None:
    opt = cfg.get("optimizer")
    if opt is None:
        notes.append("no optimizer section (the training script builds it): planned with AdamW")
        return
    if not isinstance(opt, dict) or not isinstance(opt.get("type"), str):
        raise bad("optimizer", "must be an object with a \"type\" (e.g. {\"type\": \"AdamW\"})")
    params = opt.get("params") or {}
    kind = opt["type"].lower()
    # DeepSpeed's "Adam" runs FusedAdam / DeepSpeedCPUAdam with adam_w_mode true by default
    w_mode = params.get("adam_w_mode", defaults()["deepspeed"]["adam_w_mode"])
    table = {"adamw": "adamw", "adam": "adamw" if w_mode else "adam", "lion": "lion",
             "fusedadam": "adamw", "cpuadam": "adamw", "sgd": "sgd-momentum" if params.get("momentum") else "sgd",
             "adafactor": "adafactor"}
    if kind not in table:
        raise bad("optimizer.type", f"{opt['type']!r:.40} is not planned; planned: Adam, AdamW, Lion, SGD, Adafactor "
                  "(its state is what a plan counts)")
    out["optimizer"] = table[kind]


def _zero(cfg: dict, out: dict, unknown: list[str], ignored: list[str]) -> None:
    z = cfg.get("zero_optimization") or {}
    if not isinstance(z, dict):
        raise bad("zero_optimization", "must be an object")
    stage = z.get("stage", 0)
    if isinstance(stage, bool) or stage not in (0, 1, 2, 3):
        raise bad("zero_optimization.stage", f"must be 0, 1, 2 or 3 (got {stage!r:.40})")
    out["zero"] = stage
    overlap = z.get("overlap_comm")
    ds = defaults()["deepspeed"]  # DeepSpeed's default: on for ZeRO-3 only
    out["overlap_dp"] = overlap if isinstance(overlap, bool) else ds["overlap_comm_stage3" if stage == 3 else
                                                                    "overlap_comm_other"]
    for key, option in (("offload_optimizer", "offload_optimizer"), ("offload_param", "offload_params")):
        section = z.get(key)
        if section is None:
            continue
        device = section.get("device", "none") if isinstance(section, dict) else section
        if device == "cpu":
            out[option] = True
        elif device == "nvme":
            out[option] = True
            unknown.append(f"zero_optimization.{key}.device nvme (planned as host memory)")
        elif device not in ("none", None):
            raise bad(f"zero_optimization.{key}.device", f"must be cpu, nvme or none (got {device!r:.40})")
    mics = z.get("mics_shard_size")
    if mics not in (None, -1):
        out["_mics"] = mics
    for key in z:
        if key in ("stage", "overlap_comm", "offload_optimizer", "offload_param", "mics_shard_size"):
            continue
        (ignored if key in ZERO_NOT_PLANNED else unknown).append(f"zero_optimization.{key}")


def _batch(cfg: dict, out: dict, notes: list[str]) -> list[str]:
    """The batch keys (DeepSpeed's rule: train_batch_size = micro-batch x accumulation x data-
    parallel ranks; what is missing is derived once the GPU count is known, imports.merge), and
    those left "auto"."""
    gbs, mbs, ga = (_int(cfg, k) for k in ("train_batch_size", "train_micro_batch_size_per_gpu",
                                           "gradient_accumulation_steps"))
    autos = [k for k in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                         "gradient_clipping") if _auto(cfg.get(k))]
    if gbs:
        out["gbs"] = gbs
    if mbs:
        out["mbs"] = mbs
    if gbs and mbs and ga:
        if gbs % (mbs * ga):
            raise bad("train_batch_size", f"{gbs} is not train_micro_batch_size_per_gpu {mbs} x "
                      f"gradient_accumulation_steps {ga} x the data-parallel ranks (DeepSpeed's batch rule)")
        out["dp"] = gbs // (mbs * ga)
        notes.append(f"{out['dp']} data-parallel ranks: train_batch_size / (micro-batch x accumulation)")
    elif ga and not gbs and mbs:
        out["_ga"] = ga
    elif gbs and not mbs:  # DeepSpeed derives the micro-batch: train_batch_size / (accumulation x ranks)
        out["_micro_from"] = ga or 1
    return autos


def read_deepspeed(text: str, path: Path, model_given: bool = False) -> Imported:
    try:
        cfg = json.loads(text, parse_constant=lambda c: math.nan)
    except json.JSONDecodeError as exc:
        raise PlanError("from", f"{path} is not valid JSON (line {exc.lineno}: {exc.msg})") from None
    if not isinstance(cfg, dict):
        raise PlanError("from", f"{path}: a DeepSpeed configuration is a JSON object")
    if not model_given:
        raise PlanError("model", "a DeepSpeed configuration does not name the model: give --model (a catalog name, "
                        "or a Hugging Face org/name in the local cache) or --hf-config config.json")
    out: dict = {"framework": "deepspeed"}
    notes: list[str] = []
    unknown: list[str] = []
    ignored: list[str] = []
    autos = _batch(cfg, out, notes)
    clip = cfg.get("gradient_clipping")
    if clip is not None and not _auto(clip):
        if isinstance(clip, bool) or not isinstance(clip, int | float) or not math.isfinite(clip) or clip < 0:
            raise bad("gradient_clipping", f"must be a finite number >= 0 (got {clip!r:.40})")
        out["grad_clip"] = float(clip)
    elif clip is None:
        out["grad_clip"] = float(defaults()["deepspeed"]["gradient_clipping"])  # DeepSpeed's default: none
    bf16, fp16 = _enabled(cfg.get("bf16") or cfg.get("bfloat16")), _enabled(cfg.get("fp16"))
    if bf16 is None or fp16 is None:
        autos.append("bf16.enabled" if bf16 is None else "fp16.enabled")
    out["precision"] = "bf16" if bf16 else "fp16" if fp16 else "fp32"
    if bf16 is None and not fp16:
        out["precision"] = "bf16"  # "auto" under the Hugging Face Trainer: its --bf16, the usual choice
    comm = cfg.get("communication_data_type")
    if comm is not None:
        if comm not in DTYPES:
            raise bad("communication_data_type", f"must be fp32, fp16 or bf16 (got {comm!r:.40})")
        out["reduce_dtype"] = DTYPES[comm]
    _optimizer(cfg, out, notes)
    _zero(cfg, out, unknown, ignored)
    if "activation_checkpointing" in cfg:
        out["recompute"] = "full"
        notes.append("activation_checkpointing: planned as full recompute of each layer (the model's code decides "
                     "what it checkpoints)")
    tp = cfg.get("tensor_parallel")
    if isinstance(tp, dict) and tp.get("autotp_size") not in (None, 1):
        out["tp"] = _int(tp, "autotp_size", "tensor_parallel.")
    ep = cfg.get("expert_parallel")  # AutoEP
    if isinstance(ep, dict) and ep.get("enabled", True) and ep.get("autoep_size") not in (None, 1):
        out["ep"] = _int(ep, "autoep_size", "expert_parallel.")
    types = cfg.get("data_types")
    if isinstance(types, dict) and types.get("grad_accum_dtype") is not None:
        if types["grad_accum_dtype"] not in DTYPES:
            raise bad("data_types.grad_accum_dtype", f"must be fp32, fp16 or bf16 (got {types['grad_accum_dtype']!r:.40})")
        out["grad_dtype"] = DTYPES[types["grad_accum_dtype"]]
    for key in ("sequence_parallel_size", "pipeline", "zenflow", "compression_training", "curriculum_learning",
                "progressive_layer_drop", "moe", "hybrid_engine"):
        if key in cfg:
            unknown.append(key)
    mics = out.pop("_mics", None)
    if mics:
        out["dp_shard"] = mics // out.get("cp", 1)
    ga = out.pop("_ga", None)
    if ga:
        notes.append(f"gradient_accumulation_steps {ga} without train_batch_size: the global batch is "
                     f"micro-batch x {ga} x the data-parallel ranks")
        out["_accumulation"] = ga
    if autos:
        notes.append(f"\"auto\" (filled by the trainer): {', '.join(autos)}: planned with trainplan's defaults")
    known = {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "gradient_clipping",
             "bf16", "bfloat16", "fp16", "communication_data_type", "optimizer", "zero_optimization",
             "activation_checkpointing", "tensor_parallel", "expert_parallel", "data_types"}
    for key in cfg:
        if key in NOT_PLANNED or key.startswith("_"):  # "_..." keys: comments to the reader
            ignored.append(key)
        elif key not in known and key not in unknown:
            unknown.append(key)
    return Imported("deepspeed", out, ignored=ignored, unknown=unknown, notes=notes)
