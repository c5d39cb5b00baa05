"""The Python API: `from trainplan import plan, search`.

    from trainplan import plan
    result = plan(model="llama-3-8b", gpus=8, zero=3, mbs=2)      # the dict of `trainplan plan --json`
    result = plan(from_file="train_llama3.sh", gpus=64)            # a Megatron-LM / DeepSpeed / torchtitan config

Keyword arguments are the CLI's options with underscores (`--seq-len` is `seq_len`), and take
the same values; a bad one raises trainplan.errors.PlanError (its `field` and `rule`). The CLI
is a layer over these functions.
"""

from __future__ import annotations

import sys
import types

from .errors import PlanError


def plan_options(options: dict, from_file: str | None = None, hf_config: str | None = None,
                 messages: list[str] | None = None) -> tuple[dict, dict | None]:
    """The plan options for `options` (only those the caller set) and, when given, a
    configuration file's (the caller's on top), with what the import said about the file."""
    options = {k: v for k, v in options.items() if v is not None}
    if hf_config is not None:
        if "model" in options:
            raise PlanError("hf_config", "names the model as --model does: give one of them")
        options["model"] = hf_config
    if from_file is None:
        return options, None
    from .imports import merge, read_config

    imported = read_config(from_file, model_given="model" in options or "hf_config" in options)
    merged = merge(imported, options)
    if messages is not None:
        messages += imported.messages()
    report = {"format": imported.format, "file": str(from_file), "not_understood": imported.unknown,
              "not_planned": imported.ignored, "notes": imported.notes}
    return merged, report


def plan(*, from_file: str | None = None, hf_config: str | None = None, **options) -> dict:
    """Memory, time and cost of one training run: the same dict as `trainplan plan --json`
    (with an "import" entry when `from_file` is given: what the file set and what it did not
    understand)."""
    from .plan import make_plan
    from .report import evaluate, to_json

    opts, report = plan_options(options, from_file, hf_config)
    data = to_json(evaluate(make_plan(**opts)))
    if report is not None:
        data["import"] = report
    return data


def search(*, from_file: str | None = None, hf_config: str | None = None, top: int = 5, objective: str = "time",
           max_tp: int | None = None, fixed: list[str] | None = None, **options) -> dict:
    """The fastest (or cheapest) layouts that fit: the dict of `trainplan search --json`. The
    layout options you pass (tp, pp, zero, mbs ...) stay fixed, as on the command line, and so do
    those named in `fixed`; the others are searched (a configuration file's layout too)."""
    from .plan import make_plan
    from .search import LAYOUT_DIMENSIONS
    from .search import search as run_search

    keep = {d for d in LAYOUT_DIMENSIONS if options.get(d) is not None} | set(fixed or ())
    bad = sorted(keep - set(LAYOUT_DIMENSIONS))
    if bad:
        raise PlanError("fixed", f"not layout dimensions: {', '.join(bad)} (they are {', '.join(LAYOUT_DIMENSIONS)})")
    if not 1 <= top <= 1000:
        raise PlanError("top", "must be between 1 and 1000")
    opts, report = plan_options(options, from_file, hf_config)
    data = run_search(make_plan(**opts), keep, top=top, objective=objective, max_tp=max_tp)
    if report is not None:
        data["import"] = report
    return data


class _CallableModule(types.ModuleType):
    """A module that is also its function: `trainplan.plan` is the module of the Plan model and
    `from trainplan import plan; plan(...)` the API function, whichever was imported first."""

    def __call__(self, *args, **kwargs):
        return _FUNCTIONS[self.__name__](*args, **kwargs)


_FUNCTIONS = {"trainplan.plan": plan, "trainplan.search": search}


def make_callable(module_name: str) -> None:
    sys.modules[module_name].__class__ = _CallableModule
