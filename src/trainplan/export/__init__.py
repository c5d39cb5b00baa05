"""Ready-to-run configurations for training frameworks, from a resolved plan.

Each target writes the run the plan priced or refuses, naming what it cannot express
(a PlanError: exit 2 on the CLI). `export_plan` is the whole path from plan options (the
`plan` command's, as a dict) to a file name and its text, for pages and scripts.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import PlanError

TARGETS = ("megatron", "deepspeed", "torchtitan")
# The planner's framework convention each target runs (conventions.toml [frameworks]): an
# export is priced, and a search ranked, under its target's memory and time rules.
CONVENTIONS = {"megatron": "megatron", "deepspeed": "deepspeed", "torchtitan": "fsdp"}
# Layout dimensions a target's configuration cannot vary: `search --export` keeps them at the
# plan's values (1, 1, off) instead of ranking layouts the export would refuse.
FIXED_DIMENSIONS = {"megatron": (), "deepspeed": ("pp", "cp", "sp"), "torchtitan": ()}
FILENAMES = {"megatron": "megatron_args.txt", "deepspeed": "ds_config.json", "torchtitan": "run_torchtitan.sh"}


@dataclass(frozen=True)
class Export:
    target: str
    filename: str  # a suggested file name
    text: str  # what the framework reads, and only that
    notes: tuple[str, ...]  # what the user still sets, and where the framework runs otherwise


def check_target(target: str, field: str = "to") -> None:
    if target not in TARGETS:
        raise PlanError(field, f"must be one of {', '.join(TARGETS)} (got {target!r:.40})")


def target_framework(target: str, framework: str | None, field: str = "framework") -> str:
    """The framework convention to plan an export to `target` under: the target's own; a
    different one given explicitly is refused (its memory and time would not be the run's)."""
    want = CONVENTIONS[target]
    if framework is not None and framework != want:
        raise PlanError(field, f"an export to {target} is planned under {want}'s conventions (got {framework}); "
                        f"drop --framework or pass {want}")
    return want


def export_layout(layout, target: str) -> Export:
    check_target(target)
    if layout.plan.finetune != "full" and target in ("megatron", "torchtitan"):
        # LoRA lives in the model code (Hugging Face PEFT under DeepSpeed), not in these configs
        raise PlanError("finetune", f"{target}'s configuration has no LoRA adapters; export a "
                        f"{layout.plan.finetune} plan to deepspeed (with PEFT applying the adapters)")
    if target == "megatron":
        from . import megatron as mod

        text = mod.megatron_args(layout)
    elif target == "deepspeed":
        from . import deepspeed as mod

        text = mod.deepspeed_config(layout)
    else:
        from . import torchtitan as mod

        text = mod.torchtitan_script(layout)
    return Export(target, FILENAMES[target], text, tuple(mod.notes(layout)))


def export(layout, target: str) -> str:
    """The file's text alone."""
    return export_layout(layout, target).text


def export_plan(options: dict, target: str) -> tuple[str, str]:
    """Plan options (the `plan` command's, as keyword arguments) -> (file name, text), planned
    under the target's framework convention. Raises PlanError for what the target cannot express."""
    from ..plan import make_plan, resolve

    check_target(target)
    options = {**options, "framework": target_framework(target, options.get("framework"))}
    e = export_layout(resolve(make_plan(**options)), target)
    return e.filename, e.text
