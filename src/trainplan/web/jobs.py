"""The work behind each endpoint, from validated options to the answer's bytes.

Plain functions of plain data, so that the server can run them in a thread (a plan) or in a
worker process (a search, a comparison: `pool`). Bad input raises PlanError; a figure that is
not finite a `body.Refusal` naming it.
"""

from __future__ import annotations

from .body import dumps
from .schemas import web_plan

SEARCH_MAX_LAYOUTS = 200_000  # web searches are bounded in layouts ...
SEARCH_MAX_SECONDS = 5.0  # ... and in time (the best found so far is returned)
COMPARE_MAX_SECONDS = 20.0  # a comparison's searches together (each still bounded as one search)


def plan_json(options: dict, timeline: bool, explain: bool = False) -> bytes:
    from ..report import evaluate, to_json

    result = evaluate(web_plan(options))
    data = to_json(result)
    if timeline:
        data["timeline"] = _timeline(result)
    if explain:
        from ..explain_json import explain_json

        data["explain"] = explain_json(result)
    return dumps(data)


def search_json(options: dict, fixed: list[str], top: int, objective: str) -> bytes:
    from ..search import search

    data = search(web_plan(options), set(fixed), top=top, objective=objective, max_layouts=SEARCH_MAX_LAYOUTS,
                  max_seconds=SEARCH_MAX_SECONDS)
    return dumps(data)


def compare_plans(options: dict, accelerators: str | list[str]) -> list:
    """The plans to compare, one per accelerator (PlanError naming the field if any is wrong)."""
    from ..errors import PlanError
    from ..search import accelerator_plans

    if options.get("gpu") is not None:
        raise PlanError("compare_gpus", "replaces gpu: name every accelerator to compare in compare_gpus")
    web_plan(options)  # the options themselves, checked once
    return accelerator_plans(options, accelerators)


def compare_json(options: dict, accelerators: str | list[str], fixed: list[str], objective: str) -> bytes:
    from ..search import compare_gpus

    data = compare_gpus(compare_plans(options, accelerators), set(fixed), objective=objective,
                        max_layouts=SEARCH_MAX_LAYOUTS, max_seconds=SEARCH_MAX_SECONDS,
                        total_seconds=COMPARE_MAX_SECONDS)
    return dumps(data)


def _timeline(result, max_micro_batches: int = 16) -> dict | None:
    """The simulated schedule of the first micro-batches, for the page to draw (None where its
    simulation would cost more than trainplan.limits.MAX_TIMELINE_STEPS)."""
    from ..estimate.torch_schedules import stage_ranks
    from ..timeline import drawn_micro_batches, runs_torch_order, simulate_layout

    L, t = result.layout, result.time
    m = drawn_micro_batches(L, max_micro_batches)
    if m is None:
        return None
    sim = simulate_layout(L, m, t["per_microbatch_stage_s"])
    # a row per rank; under torch's schedules with several stages a rank, the stages each holds
    ranks = stage_ranks(L.plan.schedule, L.pp, L.vpp) if runs_torch_order(L) and L.vpp > 1 else None
    return {"micro_batches": m, "step_s": sim.step_time, "bubble_fraction": sim.bubble_fraction,
            "ops": [[op.stage, op.kind, op.mb, op.start, op.end] for op in sim.ops], "rank_stages": ranks}


def export_json(options: dict, target: str) -> bytes:
    """The plan's run written for `target` (`export.export_plan`): its file name and text."""
    from ..export import check_target, export_plan

    check_target(target, field="target")
    filename, text = export_plan(options, target)
    return dumps({"target": target, "filename": filename, "text": text})


def import_json(text: str, name: str, model: str | None) -> bytes:
    """The plan options a configuration's text sets (`imports.read_text`, untrusted: a torchtitan
    command may name torchtitan's own configs only), checked by planning them, with what the
    file set that a plan does not read and what was not understood."""
    from ..imports import merge, read_text
    from ..plan import make_plan, resolve

    imported = read_text(text, name, model_given=model is not None, trusted=False)
    options = merge(imported, {"model": model} if model else {})
    resolve(make_plan(**options))  # a run that cannot be planned is refused here, naming the field
    return dumps({"format": imported.format, "options": options, "not_understood": imported.unknown,
                  "notes": imported.notes, "ignored": imported.ignored})


JOBS = {"plan": plan_json, "search": search_json, "compare": compare_json}
