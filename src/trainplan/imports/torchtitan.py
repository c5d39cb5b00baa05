"""torchtitan jobs as plans: 0.3's command line (`--module llama3 --config llama3_8b` and dotted
overrides such as `--parallelism.tensor_parallel_degree 8`), and the TOML job files of
earlier releases ([model], [training], [parallelism], [activation_checkpoint] ...).

0.3 builds its job from a Python function of the module's config_registry: the reader calls
that function (torchtitan is then needed: the `frameworks` extra) and applies the overrides.
Both forms become the same sections, read by one function, with torchtitan's meaning
(torchtitan/trainer.py: the global batch is local_batch_size x the data-parallel degree unless
global_batch_size says otherwise, the rest is gradient accumulation;
distributed/pipeline_parallel.py: multi-stage schedules run 2 stages per rank unless
pipeline_parallel_layers_per_stage sets them).
"""

from __future__ import annotations

import dataclasses
import math
import re
import tomllib
from pathlib import Path

from ..errors import PlanError
from . import Imported, bad, defaults
from .shell import command_words

# torch.distributed.pipelining schedule names (schedules.py get_schedule_class) -> the planner's
SCHEDULES = {"gpipe": "gpipe", "1f1b": "1f1b", "interleaved1f1b": "interleaved", "interleavedzerobubble": "zb",
             "loopedbfs": "looped_bfs", "zbvzerobubble": "zbv", "dualpipev": "dualpipev"}
# 0.3 command-line fields read under the TOML files' names
OVERRIDE_KEYS = {"optimizer.param_groups.0.optimizer_name": "optimizer.name"}
MULTI_STAGE = ("interleaved", "looped_bfs", "zbv", "dualpipev", "zb")
DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
# read, and not part of a plan
NOT_PLANNED_SECTIONS = {"job", "profiling", "profiler", "metrics", "lr_scheduler", "checkpoint", "validation",
                        "validator", "comm", "debug", "fault_tolerance", "experimental", "memory_estimation",
                        "dataloader", "tokenizer",
                        # the float8 recipe's options ([float8], later [quantize.*]): model.converters decides
                        "float8", "quantize"}
NOT_PLANNED_KEYS = {
    "model": {"tokenizer_path", "hf_assets_path", "print_after_conversion", "converters"},
    "training": {"steps", "dataset", "dataset_path", "compile", "gc_freq", "gc_debug", "seed", "deterministic",
                 "warmup_steps", "disable_cuda_graphs"},
    "optimizer": {"lr", "eps", "weight_decay", "beta1", "beta2", "early_step_in_backward"},
    "parallelism": {"enable_compiled_autograd", "spmd_backend", "context_parallel_load_balancer",
                    "context_parallel_ptrr_mask_key", "pipeline_parallel_schedule_csv", "pipeline_parallel_split_points",
                    "module_fqns_per_model_part", "enable_fsdp_symm_mem", "pipeline_parallel_first_stage_less_layers",
                    "pipeline_parallel_last_stage_less_layers", "pipeline_parallel_layers_per_stage"},
    "activation_checkpoint": {"selective_ac_option", "preserve_rng_state", "determinism_check", "debug",
                              "per_op_sac_force_recompute_mm_shapes_by_fqns", "early_stop"},
    "compile": {"backend"},
    "float8": {"enable_fsdp_float8_all_gather", "precompute_float8_dynamic_scale_for_fsdp", "filter_fqns",
               "recipe_name", "emulate", "force_recompute_fp8_weight_in_bwd"},
}


def _toml_sections(text: str, path: Path) -> dict:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PlanError("from", f"{path} is not valid TOML ({exc})") from None
    return data


def _value(text: str):
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _select(words: list[str], env: dict) -> int | None:
    """Where a torchtitan command's arguments start: after `-m torchtitan.train`, after the
    launcher script given MODULE= and CONFIG=, or after whatever precedes --module."""
    if "torchtitan.train" in words:
        return words.index("torchtitan.train")
    if words and ("MODULE" in env or "CONFIG" in env):
        return 0
    first = next((i for i, w in enumerate(words) if w == "--module" or w.startswith("--module=")), None)
    return first - 1 if first else None


def _launcher_gpus(launcher: list[str], env: dict, variables: dict) -> int | None:
    """NGPU (run_train.sh's), or torchrun's --nproc-per-node x --nnodes."""
    ngpu = env.get("NGPU") or variables.get("NGPU")
    if ngpu and ngpu.isdigit():
        return int(ngpu)
    per, nodes = None, "1"
    for i, w in enumerate(launcher):
        key, eq, val = w.partition("=")
        val = val if eq else (launcher[i + 1] if i + 1 < len(launcher) else "")
        if key in ("--nproc-per-node", "--nproc_per_node"):
            per = val
        elif key == "--nnodes":
            nodes = val
    return int(per) * int(nodes) if per and per.isdigit() and nodes.isdigit() else None


# tyro's subcommand for the activation checkpointing union: activation-checkpoint:<kind>
_AC_SUBCOMMAND = re.compile(r"^activation[-_]checkpoint:([\w.-]+)$")


def _command(text: str) -> tuple[str | None, str | None, list[tuple[str, object]], int | None, list[str]]:
    """--module, --config, the dotted overrides, the GPU count and stray words."""
    read = command_words(text, select=_select)
    module, config = read.env.get("MODULE"), read.env.get("CONFIG")
    overrides: list[tuple[str, object]] = []
    stray: list[str] = []
    words = read.words
    i = 0
    while i < len(words):
        w = words[i]
        key, eq, val = w.partition("=")
        takes_value = not eq and i + 1 < len(words) and not words[i + 1].startswith("--") \
            and not _AC_SUBCOMMAND.match(words[i + 1])
        m = _AC_SUBCOMMAND.match(w)
        if m:
            kind = m.group(1).lower()
            mode = "full" if "full" in kind else "selective" if "selective" in kind else "none" if "none" in kind \
                else kind
            overrides.append(("activation_checkpoint.mode", mode))
        elif key in ("--module", "--config"):
            val = val if eq else (words[i + 1] if i + 1 < len(words) else "")
            i += 0 if eq else 1
            module, config = (val, config) if key == "--module" else (module, val)
        elif key.startswith("--") and "." in key:
            section, _, field = key[2:].partition(".")
            section, field = section.replace("-", "_"), field.replace("-", "_")
            if eq or takes_value:
                if not eq:
                    val = words[i + 1]
                    i += 1
                overrides.append((f"{section}.{field}", _value(val)))
            elif field.startswith("no_"):
                overrides.append((f"{section}.{field[3:]}", False))
            else:
                overrides.append((f"{section}.{field}", True))
        else:
            stray.append(w)
        i += 1
    return module, config, overrides, _launcher_gpus(read.launcher, read.env, read.variables), stray


def _registry_sections(module: str, config: str, trusted: bool = True) -> dict:
    """The sections of torchtitan 0.3's config function `module.config_registry.config`.
    Untrusted text (pasted into the web page) names torchtitan's own modules only."""
    import importlib

    # as torchtitan's ConfigManager._load_config: a short name under torchtitan.models (or
    # .experiments), else (a user's own configs) an importable module path, with or without
    # .config_registry
    if not re.fullmatch(r"[A-Za-z_][\w.]*", module) or not re.fullmatch(r"[A-Za-z_]\w*", config):
        raise bad("module", f"--module {module!r:.60} --config {config!r:.60} name no Python module and function")
    candidates = [f"torchtitan.models.{module}.config_registry", f"torchtitan.experiments.{module}.config_registry"]
    if trusted:
        candidates += [f"{module}.config_registry", module]
    registry = None
    for name in candidates:
        try:
            registry = importlib.import_module(name)
            break
        except ModuleNotFoundError as exc:
            if exc.name == "torchtitan":
                raise PlanError("from", "reading torchtitan's --module/--config needs torchtitan installed (the "
                                "frameworks extra)") from None
            continue
        except ImportError as exc:
            raise PlanError("from", f"torchtitan's {module} needs a package that is not installed ({exc})") from None
    if registry is None:
        raise bad("module", f"no torchtitan config module {module!r:.60} (tried {', '.join(candidates)})")
    fn = getattr(registry, config, None)
    # a config function of that module (not one it imported), as config_registry's are
    if not callable(fn) or getattr(fn, "__module__", None) != registry.__name__ or config.startswith("_"):
        raise bad("config", f"torchtitan's {module} module has no config {config!r:.60}")
    try:
        job = fn()
    except ImportError as exc:
        raise PlanError("from", f"torchtitan's {config} needs a package that is not installed ({exc})") from None
    except Exception as exc:  # noqa: BLE001 - the config function's own failure, as one line
        raise bad("config", f"torchtitan's {module}.{config}() failed ({type(exc).__name__}: {exc})") from None
    if not hasattr(job, "model_spec") or not hasattr(job, "parallelism"):
        raise bad("config", f"{module}.{config}() returns no torchtitan Trainer.Config")
    spec = job.model_spec
    sections = {
        "model": {"name": spec.name, "flavor": spec.flavor},
        "training": dataclasses.asdict(job.training),
        "parallelism": {f.name: getattr(job.parallelism, f.name) for f in dataclasses.fields(job.parallelism)},
        "compile": {"enable": job.compile.enable, "enable_async_tensor_parallel": job.compile.enable_async_tensor_parallel},
    }
    ac = type(job.activation_checkpoint).__qualname__ if job.activation_checkpoint is not None else "None"
    sections["activation_checkpoint"] = {"mode": "full" if ac.startswith("FullAC") else
                                         "selective" if ac.startswith("SelectiveAC") else "none"}
    groups = getattr(job.optimizer, "param_groups", None) or []
    names = {g.optimizer_name for g in groups}
    if len(names) == 1:
        sections["optimizer"] = {"name": names.pop(), "implementation": job.optimizer.implementation}
    spec_text = repr(spec.model)
    if "Float8" in spec_text:
        sections["model"]["converters"] = ["float8"]
    elif "MXFP8" in spec_text or "NVFP4" in spec_text:
        sections["model"]["converters"] = ["mx" if "MXFP8" in spec_text else "nvfp4"]
    return sections


def read_torchtitan(text: str, path: Path, trusted: bool = True) -> Imported:
    notes: list[str] = []
    gpus = None
    if path.suffix == ".toml":
        sections = _toml_sections(text, path)
        overrides: list = []
        stray: list[str] = []
    else:
        module, config, overrides, gpus, stray = _command(text)
        if not module or not config:
            raise bad("", f"{path} names no torchtitan job: it needs --module and --config (torchtitan 0.3)")
        sections = _registry_sections(module, config, trusted)
        notes.append(f"torchtitan {module}.config_registry.{config}" + (f" with {len(overrides)} overrides"
                                                                         if overrides else ""))
    unknown: list[str] = [f"stray word {w!r}" for w in stray[:5]]
    for key, value in overrides:
        key = OVERRIDE_KEYS.get(key, key)
        section, _, field = key.partition(".")
        sections.setdefault(section, {})
        if not isinstance(sections[section], dict):
            unknown.append(f"--{key}")
            continue
        sections[section][field] = value
    out, ignored = _options(sections, unknown, notes)
    if gpus:
        out["gpus"] = gpus
        notes.append(f"{gpus} GPUs from the launcher; give --gpus for another count")
    return Imported("torchtitan", out, ignored=ignored, unknown=unknown, notes=notes)


def _get(sections: dict, section: str, key: str, default=None, used: set | None = None):
    sec = sections.get(section) or {}
    if used is not None:
        used.add((section, key))
    v = sec.get(key, default) if isinstance(sec, dict) else default
    return default if v is None else v


def _int(v, field: str, low: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise bad(field, f"must be an integer >= {low} (got {v!r:.40})")
    return v


def _options(sections: dict, unknown: list[str], notes: list[str]) -> tuple[dict, list[str]]:
    """The plan options of a job's sections, and the sections read but not planned."""
    used: set = set()

    def get(section, key, default=None):
        return _get(sections, section, key, default, used)

    out: dict = {"framework": "fsdp"}
    _model_numerics(get, out, unknown, notes)
    _layout(get, out)
    _training_choices(get, out, notes)
    return out, _leftovers(sections, used, unknown)


def _model_numerics(get, out: dict, unknown: list[str], notes: list[str]) -> None:
    name, flavor = get("model", "name"), get("model", "flavor")
    if name is None or flavor is None:
        raise bad("model", "the job names no model ([model] name and flavor)")
    flavors = defaults()["torchtitan"]["flavors"]  # catalog/imports.toml
    model = flavors.get(f"{name}/{flavor}")
    if model is None:
        raise bad("model.flavor", f"torchtitan's {name} {flavor!r} is not a model trainplan knows; known: "
                  f"{', '.join(k.replace('/', ' ') for k in flavors)}")
    out["model"] = model
    notes.append(f"torchtitan's {name} {flavor} is {model}")
    converters = get("model", "converters", [])
    converters = [converters] if isinstance(converters, str) else list(converters)
    if "float8" in converters:
        out["precision"] = "fp8"
    else:
        out["precision"] = "fp32" if get("training", "mixed_precision_param", "bfloat16") == "float32" else "bf16"
    for c in converters:
        if c != "float8":
            unknown.append(f"model.converters {c}")
    dtype = get("training", "dtype", "float32")  # the parameters' own dtype
    if dtype not in ("float32", "bfloat16"):
        raise bad("training.dtype", f"must be float32 or bfloat16 (got {dtype!r:.40})")
    if dtype == "bfloat16" and out["precision"] != "fp32":
        out["master_weights"] = False  # parameters and optimizer in bf16: no fp32 master copy
    reduce = get("training", "mixed_precision_reduce", "float32")
    if reduce not in DTYPES:
        raise bad("training.mixed_precision_reduce", f"must be float32 or bfloat16 (got {reduce!r:.40})")
    if reduce != "float32":  # float32: FSDP2's reduction of the fsdp convention, the plan's default
        out["reduce_dtype"] = DTYPES[reduce]
    out["grad_clip"] = float(get("training", "max_norm", 1.0))
    if get("training", "enable_cpu_offload", False):
        out["offload_optimizer"] = out["offload_params"] = True


def _layout(get, out: dict) -> None:
    """Batch and parallel degrees (the data-parallel degree and global batch wait for the GPU
    count: `finish`)."""
    seq = get("training", "seq_len", 2048)
    out["seq_len"] = _int(seq, "training.seq_len")
    local = get("training", "local_batch_size", None)
    if local is None:
        local = get("training", "batch_size", 8)  # the key's name before torchtitan 0.2
    local = _int(local, "training.local_batch_size")
    global_batch = get("training", "global_batch_size", -1)
    tp, pp = (_int(get("parallelism", k, 1), f"parallelism.{k}") for k in
              ("tensor_parallel_degree", "pipeline_parallel_degree"))
    cp = _int(get("parallelism", "context_parallel_degree", 1), "parallelism.context_parallel_degree")
    ep = _int(get("parallelism", "expert_parallel_degree", 1), "parallelism.expert_parallel_degree")
    replicate = _int(get("parallelism", "data_parallel_replicate_degree", 1),
                     "parallelism.data_parallel_replicate_degree")
    shard = get("parallelism", "data_parallel_shard_degree", -1)
    if shard != -1:
        shard = _int(shard, "parallelism.data_parallel_shard_degree")
    out.update(tp=tp, pp=pp, cp=cp, ep=ep, sp=tp > 1 and bool(get("parallelism", "enable_sequence_parallel", True)))
    etp = get("parallelism", "expert_tensor_parallel_degree", None)
    if etp not in (None, 1, tp) and tp > 1:
        raise bad("parallelism.expert_tensor_parallel_degree", f"{etp} is not planned: experts are split by the "
                  f"tensor-parallel degree ({tp}) or not at all")
    reshard = get("parallelism", "fsdp_reshard_after_forward", "default")
    if shard == 1:
        out["zero"] = 0  # replicated: DDP
    else:
        out["zero"] = 2 if reshard == "never" else 3
        if replicate > 1 and shard != -1:
            out["dp_shard"] = shard
    out["_dp"] = (replicate, shard)
    sched = str(get("parallelism", "pipeline_parallel_schedule", "1F1B"))  # read with PP only
    pp_mbs = get("parallelism", "pipeline_parallel_microbatch_size", 1)
    if pp > 1:
        if sched.lower() not in SCHEDULES:
            raise bad("parallelism.pipeline_parallel_schedule", f"{sched!r:.40} is not planned; planned: "
                      "GPipe, 1F1B, Interleaved1F1B, InterleavedZeroBubble, LoopedBFS, ZBVZeroBubble, DualPipeV")
        out["schedule"] = SCHEDULES[sched.lower()]
        mbs = _int(pp_mbs, "parallelism.pipeline_parallel_microbatch_size")
        if out["schedule"] in MULTI_STAGE:
            out["_virtual"] = (get("parallelism", "pipeline_parallel_layers_per_stage", None),
                               get("parallelism", "pipeline_parallel_first_stage_less_layers", 1),
                               get("parallelism", "pipeline_parallel_last_stage_less_layers", 1))
    else:
        mbs = local  # without PP the local batch is one forward pass
    out["mbs"] = mbs
    out["_batch"] = (local, global_batch)
    out["overlap_tp"] = bool(get("compile", "enable_async_tensor_parallel", False)
                             or get("parallelism", "enable_async_tensor_parallel", False))
    if cp > 1:
        rotate = get("parallelism", "context_parallel_rotate_method", "allgather")
        out["cp_comm"] = "allgather" if rotate == "allgather" else "ring"


def _training_choices(get, out: dict, notes: list[str]) -> None:
    mode = get("activation_checkpoint", "mode", "selective")
    if mode not in ("none", "selective", "full"):
        raise bad("activation_checkpoint.mode", f"must be none, selective or full (got {mode!r:.40})")
    out["recompute"] = mode
    if mode == "selective":
        option = str(get("activation_checkpoint", "selective_ac_option", "op"))
        if option == "op":  # per-op selective checkpointing (0.3's SelectiveAC has no other)
            from ..specs import catalog

            model = catalog.model(out["model"])
            if model.is_moe or model.is_mla:
                notes.append("per-op selective checkpointing is modelled for dense layers: planned as Megatron's "
                             "selective recompute (the attention core)")
            else:
                out["recompute"] = "selective-op"
        elif option.isdigit() and int(option) > 0:
            # an integer N: every N-th block checkpointed whole (torchtitan's ac_freq)
            out.update(recompute="full", _ac_every=int(option))
        else:
            raise bad("activation_checkpoint.selective_ac_option", f"must be 'op' or a positive integer "
                      f"(got {option!r:.40})")
    opt = str(get("optimizer", "name", "AdamW"))
    if opt not in ("AdamW", "Adam"):
        raise bad("optimizer.name", f"{opt!r:.40} is not planned; planned: AdamW, Adam")
    out["optimizer"] = opt.lower()
    impl = get("optimizer", "implementation", None)
    if impl == "fused_opt_states_bf16":  # the fused AdamW with its moments in bf16
        impl, out["optimizer_state_dtype"] = "fused", "bf16"
    if impl is not None:
        if impl not in ("fused", "foreach", "for-loop"):
            raise bad("optimizer.implementation", f"must be fused, foreach, for-loop or fused_opt_states_bf16 "
                      f"(got {impl!r:.40})")
        out["optimizer_impl"] = impl
    compiled = get("compile", "enable", False) is True and "model" in get("compile", "components", ["model", "loss"])
    legacy = get("training", "compile", False)  # [training] compile before the [compile] section
    if compiled or legacy is True:
        out["fused_kernels"] = True  # torch.compile fuses the norms and SwiGLU (calibration.py's rule)


def _leftovers(sections: dict, used: set, unknown: list[str]) -> list[str]:
    """Sections read and not planned; keys not understood go to `unknown`."""
    ignored = []
    for section, body in sections.items():
        if section in NOT_PLANNED_SECTIONS:
            ignored.append(f"[{section}]")
            continue
        if not isinstance(body, dict):
            unknown.append(section)
            continue
        for key in body:
            if (section, key) in used or key in NOT_PLANNED_KEYS.get(section, ()):
                continue
            if section in ("training", "parallelism") and isinstance(body[key], bool | int | float | str | None) \
                    and _is_default(section, key, body[key]):
                continue
            if section == "model" and not (key == "norm_type" and body[key] == "rmsnorm"):
                # [model] keys shape the model: one not understood would plan another
                raise bad(f"model.{key}", f"[model] {key} = {body[key]!r:.40} shapes the model and trainplan does "
                          "not understand it: the plan would be of another model")
            unknown.append(f"{section}.{key}")
    return ignored


# values of the 0.3 dataclasses' fields that plan nothing (their defaults): not reported as not understood
_DEFAULTS = {("training", "enable_cpu_offload"): False, ("parallelism", "context_parallel_rotate_method"): "allgather",
             ("parallelism", "enable_async_tensor_parallel"): False}


def _is_default(section: str, key: str, value) -> bool:
    if (section, key) in _DEFAULTS:
        return _DEFAULTS[(section, key)] == value
    return value in (None, False, "", -1) or (section, key) in {("parallelism", "enable_sequence_parallel")}


def finish(options: dict, notes: list[str]) -> dict:
    """The batch and data-parallel degree once the GPU count is known (torchtitan derives
    data_parallel_shard_degree -1 and the global batch from it)."""
    replicate, shard = options.pop("_dp", (1, -1))
    local, global_batch = options.pop("_batch", (None, -1))
    virtual = options.pop("_virtual", None)
    tp, pp, cp = options.get("tp", 1), options.get("pp", 1), options.get("cp", 1)
    gpus = options.get("gpus")
    if gpus is None:
        if shard != -1:
            gpus = replicate * shard * tp * pp * cp
        else:
            gpus = defaults()["torchtitan"]["ngpu"]
            notes.append(f"the job fills data_parallel_shard_degree (-1) from the GPUs it runs on: planned on {gpus} "
                         "(run_train.sh's NGPU default); give --gpus")
        options["gpus"] = gpus
    if gpus % (tp * pp * cp):
        raise bad("parallelism", f"{gpus} GPUs are not a multiple of TP {tp} x PP {pp} x CP {cp}")
    dp = gpus // (tp * pp * cp)
    if shard != -1 and replicate * shard != dp:
        raise bad("parallelism.data_parallel_shard_degree", f"replicate {replicate} x shard {shard} is not the "
                  f"{dp} data-parallel ranks of {gpus} GPUs / (TP x PP x CP)")
    if local is not None:
        gbs = global_batch if global_batch and global_batch > 0 else local * dp
        if gbs % (local * dp):
            raise bad("training.global_batch_size", f"{gbs} is not a multiple of local_batch_size {local} x the "
                      f"{dp} data-parallel ranks (torchtitan's rule)")
        options.setdefault("gbs", gbs)
        if options.get("pp", 1) > 1 and local % options.get("mbs", 1):
            raise bad("parallelism.pipeline_parallel_microbatch_size", f"must divide local_batch_size {local}")
    every = options.pop("_ac_every", None)
    if every is not None and options.get("recompute") == "full":
        from ..specs import catalog

        stage = -(-catalog.model(options["model"]).layers // pp)
        options["recompute_layers"] = stage // every
        notes.append(f"selective_ac_option {every}: every {every}th block checkpointed whole, planned as full "
                     f"recompute of {stage // every} of the {stage} layers of a stage")
    if virtual is not None:
        per, first, last = virtual
        from ..specs import catalog

        layers = catalog.model(options["model"]).layers
        stages = math.ceil((layers + first + last) / per) if per else 2 * pp
        if stages % pp:
            raise bad("parallelism.pipeline_parallel_layers_per_stage", f"{stages} virtual stages do not divide "
                      f"over PP {pp}")
        options["vpp"] = stages // pp
    return options
