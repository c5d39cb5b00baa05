"""Layout search: enumerate every valid TP x PP x DP x CP x EP x ZeRO x micro-batch x
recompute x schedule layout of a model on a cluster (`space`), evaluate them all at once with
the same array formulas `plan` uses (`bulk`, DESIGN §2), keep those that fit, and rank them;
the Pareto front of memory and throughput, the fewest GPUs for a deadline, accelerators
compared, and the largest model each sharding strategy trains (`largest`).
"""

from __future__ import annotations

import time

import numpy as np

from ..errors import PlanError
from ..limits import MAX_SEARCH_LAYOUTS
from ..plan import Plan, load_model, pipeline_rules, resolve
from ..specs.hardware import GPUSpec
from .bulk import REPRESENTATIVE, StageTable, evaluate_bulk
from .largest import STRATEGIES, family_model, max_model
from .space import (
    ENUM_BLOCK_LAYOUTS,
    LAYOUT_DIMENSIONS,
    LAYOUT_KEYS,
    Space,
    _list_layouts,
    _schedule_pairs,
    default_space,
    enumerate_layouts,
    interleavings,
    layout_plan,
    plan_vpp,
    search_batch,
    search_batch_tokens,
)

__all__ = ["CHUNK", "ENUM_BLOCK_LAYOUTS", "LAYOUT_DIMENSIONS", "LAYOUT_KEYS", "MAX_SEARCH_LAYOUTS", "OBJECTIVES",
           "REPRESENTATIVE", "STRATEGIES", "Space", "StageTable", "accelerator_plans", "batches", "compare_gpus",
           "default_space", "enumerate_layouts", "evaluate_bulk", "family_model", "interleavings", "layout_plan",
           "max_model", "min_gpus", "pareto", "pareto_front", "search", "search_batch", "search_batch_tokens",
           "smallest"]

OBJECTIVES = ("time", "cost")


def _layouts(plan: Plan, fixed: set[str], gpus: int, model, max_tp: int | None, max_layouts: int | None = None,
             deadline: float | None = None) -> tuple[dict[str, np.ndarray], bool]:
    """The layouts a search ranks (at most `max_layouts`, MAX_SEARCH_LAYOUTS unless given) and
    whether they are all of them (listing stops at `deadline`); when there are none, the rule a
    fixed value breaks, by name."""
    if plan.stage_layers is not None:
        raise PlanError("stage_layers", "a search splits each pipeline its own way (evenly, the first and last "
                        "stages lighter); price a split of your own with `trainplan plan --stage-layers`")
    space = default_space(plan, fixed, gpus, model.layers, max_tp or plan.gpus_per_node, model.is_moe)
    layouts, complete = _list_layouts(plan, space, gpus, model,
                                      MAX_SEARCH_LAYOUTS if max_layouts is None else max_layouts, deadline)
    if len(layouts["tp"]):
        return layouts, complete
    runs = _no_depth_runs(plan, space, gpus, model)
    gbs = plan.gbs or search_batch(plan.seq_len or min(model.max_position, 4096), gpus)
    # the rule broken on a depth the schedule runs on (and a count of virtual stages it runs
    # there), when the plan's own depth and count are not one
    runs = [(p, v) for p, v in runs if gpus % (plan.tp * p * plan.cp) == 0]
    depth = {}
    if runs and (plan.pp, plan.vpp or 1) not in runs:
        depth = {"pp": runs[0][0], "vpp": plan_vpp(runs[0][1])}
    try:
        resolve(plan.model_copy(update={"gpus": gpus, "gbs": gbs, **depth}), model)
    except PlanError as err:
        if plan.gbs is None and err.field == "gbs":
            raise PlanError("gbs", f"{err.rule} (the search's default global batch, about {search_batch_tokens(gpus)} "
                            "tokens; give --gbs)") from None
        raise
    raise PlanError("search", "no layout satisfies the constraints; relax the fixed dimensions")


def _no_depth_runs(plan: Plan, space: Space, gpus: int, model) -> list[tuple[int, int]]:
    """The (pipeline depth, virtual stages) pairs searched that the one schedule searched runs
    on; when there are none, the rule it breaks (a PlanError: the same on every depth, or on
    the first of two stages or more), not the plan's own depth's. Empty with several schedules or
    fewer than two depths."""
    if len(space.schedule) != 1 or len(space.pp) < 2:
        return []
    runs = [(p, v) for p, pairs in _schedule_pairs(plan, space, model, space.pp).items() for _, v in pairs]
    if runs:
        return runs
    lone = plan.model_copy(update={"schedule": space.schedule[0], "vpp": space.vpp[0] if space.vpp else None,
                                   "stage_layers": None})
    problems = {}
    for p in space.pp:
        try:
            pipeline_rules(lone, model, p)
        except PlanError as err:
            problems[p] = err
            if err.field == "vpp" and space.vpp is None:  # (a search tries every count: the first)
                try:
                    pipeline_rules(lone.model_copy(update={"vpp": 2}), model, p)
                except PlanError as err2:
                    problems[p] = err2
    if len({(e.field, e.rule) for e in problems.values()}) == 1:
        raise next(iter(problems.values()))
    p = next((q for q in space.pp if q > 1 and q in problems), next(iter(problems)))
    depths = ", ".join(str(q) for q in space.pp)
    raise PlanError(problems[p].field, f"{lone.schedule} runs on none of the pipeline depths {gpus:,} GPUs allow for "
                    f"{model.name} ({depths}); on {p} stages: {problems[p].rule}")


# Layouts per batch: each batch pays the estimate functions' fixed cost once (a GPT-3 search on
# 1,024 GPUs, 79,200 layouts, is one batch: 6-12% faster than three), the per-layout memory
# totals being worked out in cache-sized slices (bulk.SLICE); also the unit of progress reports,
# of the deadline and of Ctrl-C. Measured: benchmarks/search_speed.py.
CHUNK = 1 << 17


def batches(total: int) -> list[slice]:
    """`total` layouts cut into near-equal batches of at most CHUNK (no small remainder batch)."""
    count = max(1, -(-total // CHUNK))
    size = max(1, -(-total // count))
    return [slice(start, min(start + size, total)) for start in range(0, total, size)]


def search(plan: Plan, fixed: set[str], top: int = 5, objective: str = "time", max_tp: int | None = None,
           progress=None, spec=None, max_layouts: int | None = None, max_seconds: float | None = None) -> dict:
    """The best layouts that fit, best first, each as the full plan JSON. More than
    `max_layouts` layouts (MAX_SEARCH_LAYOUTS unless given) are refused while they are listed;
    past `max_seconds` (checked while listing and between evaluated batches) or on Ctrl-C, the
    best of what was evaluated so far is returned (`interrupted`: true)."""
    from ..report import evaluate, to_json

    if objective not in OBJECTIVES:
        raise PlanError("objective", f"must be one of {', '.join(OBJECTIVES)}")
    t0 = time.perf_counter()
    deadline = None if max_seconds is None else t0 + max_seconds
    model = spec or load_model(plan)
    gpus = plan.gpus or (plan.tp * plan.pp * plan.cp * (plan.dp or 1))
    layouts, complete = _layouts(plan, fixed, gpus, model, max_tp, max_layouts, deadline)
    total = len(layouts["tp"])
    parts, interrupted = [], not complete
    try:
        for part in batches(total):
            if deadline is not None and parts and time.perf_counter() > deadline:
                interrupted = True  # out of time: rank what was evaluated
                break
            chunk = {k: v[part] for k, v in layouts.items()}
            parts.append(evaluate_bulk(plan, chunk, gpus, model, fitting_only=True))
            if progress:
                progress(f"evaluated {part.stop:,} of {total:,} layouts")
    except KeyboardInterrupt:
        interrupted = True
    if not parts:
        raise PlanError("search", "interrupted before any layout was evaluated")
    evaluated = sum(len(p["step_s"]) for p in parts)
    layouts = {k: v[:evaluated] for k, v in layouts.items()}
    res = {k: np.concatenate([p[k] for p in parts]) for k in ("fits", "tokens_per_s")}
    fits = np.flatnonzero(res["fits"])
    if not len(fits):
        raise PlanError("search", f"none of the {evaluated:,} layouts fits in memory; add GPUs, lower the "
                        "sequence or micro-batch, or allow recompute and ZeRO")
    # seconds per token; on a fixed number of GPUs at one price, dollars per token are the same
    # order (gpus x price / tokens per second), so both objectives rank the layouts alike (and an
    # accelerator without a price still ranks by speed); `compare_gpus` ranks across prices
    order = fits[smallest(1.0 / res["tokens_per_s"][fits], top)]
    best = []
    for i in order:
        p = layout_plan(plan, layouts, int(i), gpus)
        data = to_json(evaluate(p, spec=model))  # the model already loaded (an hf_config is parsed once)
        best.append(data)
    return {"evaluated": evaluated, "feasible": int(len(fits)), "seconds": time.perf_counter() - t0,
            "objective": objective, "interrupted": interrupted,
            # the global batch every layout trains: the plan's, or search_batch's when it gives none
            "gbs": int(layouts["gbs"][0]), "gbs_given": plan.gbs is not None, "best": best}


def smallest(key: np.ndarray, k: int) -> np.ndarray:
    """Indices of the `k` smallest keys, smallest first, equal keys in index order: a stable
    sort's first `k`, sorting only those no larger than the k-th smallest."""
    if k >= len(key):
        return np.argsort(key, kind="stable")
    if k <= 0:
        return np.zeros(0, dtype=np.int64)
    kth = np.partition(key, k - 1)[k - 1]
    if np.isnan(kth):  # (NaNs sort last)
        return np.argsort(key, kind="stable")[:k]
    candidates = np.flatnonzero(key <= kth)
    return candidates[np.argsort(key[candidates], kind="stable")][:k]


# ---- Pareto fronts -------------------------------------------------------------------------
def pareto_front(cost: np.ndarray, benefit: np.ndarray) -> np.ndarray:
    """Indices of the points no other point beats on both axes (lower cost, higher benefit),
    sorted by cost."""
    order = np.lexsort((-benefit, cost))
    front, best = [], -np.inf
    for i in order:
        if benefit[i] > best:
            front.append(i)
            best = benefit[i]
    return np.asarray(front, dtype=np.int64)


def pareto(plan: Plan, fixed: set[str], max_tp: int | None = None) -> dict:
    """Memory vs throughput: the layouts that fit for which no other fits in less memory and
    runs faster."""
    model = load_model(plan)
    gpus = plan.gpus or (plan.tp * plan.pp * plan.cp * (plan.dp or 1))
    lay = _layouts(plan, fixed, gpus, model, max_tp)[0]
    res = evaluate_bulk(plan, lay, gpus, fitting_only=True)
    fits = np.flatnonzero(res["fits"])
    front = fits[pareto_front(res["peak_bytes"][fits], res["tokens_per_s"][fits])]
    points = []
    for i in front:
        p = layout_plan(plan, lay, int(i), gpus)
        points.append({"peak_bytes": float(res["peak_bytes"][i]), "tokens_per_s": float(res["tokens_per_s"][i]),
                       "parallel": {k: getattr(p, k) for k in ("tp", "pp", "cp", "ep", "zero", "mbs", "recompute",
                                                                "schedule", "vpp")}})
    return {"evaluated": len(lay["tp"]), "feasible": int(len(fits)), "gbs": int(lay["gbs"][0]),
            "gbs_given": plan.gbs is not None, "front": points,
            "all": {"peak_bytes": res["peak_bytes"][fits].tolist(), "tokens_per_s": res["tokens_per_s"][fits].tolist()}}


# ---- how many GPUs -------------------------------------------------------------------------
def min_gpus(plan: Plan, fixed: set[str], days: float, tokens: float | None = None, max_gpus: int = 1 << 17,
             max_tp: int | None = None, total_seconds: float | None = None, **limits) -> dict:
    """The fewest GPUs (doubling from a node of 8, or one smaller node) whose best layout trains
    `tokens` (default 20 per parameter) within `days`, goodput included. `limits` bound each
    search (`search`'s max_layouts, max_seconds); `total_seconds` all of them: past it, the sizes
    not reached are not tried (a PlanError when none met the deadline)."""
    from ..estimate.cost import CHINCHILLA_TOKENS_PER_PARAM

    if days <= 0:
        raise PlanError("days", "must be positive")
    t0 = time.perf_counter()
    model = load_model(plan)
    tokens = tokens or plan.tokens or CHINCHILLA_TOKENS_PER_PARAM * model.params
    tried, refused = [], []
    # from a server's worth (GPUSpec's default scale-up domain): a GB200 rack or a TPU slice also
    # comes in smaller sizes
    gpus = min(plan.gpus_per_node, GPUSpec.model_fields["scale_up_domain"].default)
    while gpus <= max_gpus:
        left = None if total_seconds is None else total_seconds - (time.perf_counter() - t0)
        if left is not None and left <= 0:
            raise PlanError("days", f"no cluster of the {len(tried)} sizes tried trains {tokens:.3g} tokens in "
                            f"{days:g} days, and no larger one was tried within {total_seconds:g} s")
        each = _within(limits.get("max_seconds"), left)
        try:
            out = search(plan.model_copy(update={"gpus": gpus, "tokens": tokens}), fixed, top=1, max_tp=max_tp,
                         **{**limits, "max_seconds": each})
        except PlanError as err:
            out = None
            refused.append(err)
        if out and out["best"]:
            best = out["best"][0]
            tried.append({"gpus": gpus, "days": best["training"]["days"]})
            if best["training"]["days"] <= days:
                return {"gpus": gpus, "tokens": tokens, "deadline_days": days, "best": best, "tried": tried}
        else:
            tried.append({"gpus": gpus, "days": None})
        gpus *= 2
    fastest = min((t["days"] for t in tried if t["days"]), default=None)
    if fastest is None and refused:
        # no size could be planned at all: the rule that stopped it, one that no size can meet (a
        # link, a dtype) before "nothing fits"
        raise next((e for e in refused if e.field != "search"), refused[-1])
    raise PlanError("days", f"no cluster up to {max_gpus:,} GPUs trains {tokens:.3g} tokens in {days:g} days "
                    f"(fastest: {fastest:.1f} days)")


def _within(seconds: float | None, left: float | None) -> float | None:
    """The tighter of a search's own time limit and what is left of an overall one (None: none)."""
    return seconds if left is None else left if seconds is None else min(seconds, left)


# ---- across accelerators -------------------------------------------------------------------
def compare_gpus(plans: list[Plan], fixed: set[str], objective: str = "time", max_tp: int | None = None,
                 days: float | None = None, progress=None, total_seconds: float | None = None, **limits) -> dict:
    """The same training on each accelerator: `plans` differ only in their accelerator. Each
    gets its best layout on the plan's GPU count (`search`), or with `days` the fewest GPUs
    that meet the deadline and their best layout (`min_gpus`). Ranked by `objective`: time
    (most tokens per second; with `days`, fewest GPUs, then fewest days) or cost (fewest
    dollars for the training, accelerators without a price last); an accelerator on which
    nothing fits (or whose links the catalog lacks) comes last, with the reason. `limits`
    bound each search (`search`'s max_layouts, max_seconds); `total_seconds` all of them: the
    accelerators not reached by then say so."""
    if objective not in OBJECTIVES:
        raise PlanError("objective", f"must be one of {', '.join(OBJECTIVES)}")
    rows, t0 = [], time.perf_counter()
    for plan in plans:
        name = plan.gpu
        left = None if total_seconds is None else total_seconds - (time.perf_counter() - t0)
        if left is not None and left <= 0:
            rows.append({"gpu": name, "best": None, "reason": f"not searched: the comparison ran past its "
                         f"{total_seconds:g} s; compare fewer accelerators"})
            continue
        if progress:
            progress(f"searching {name}…")
        # each search stops by the comparison's deadline too
        bounded = {**limits, "max_seconds": _within(limits.get("max_seconds"), left)}
        try:
            if days is None:
                out = search(plan, fixed, top=1, objective=objective, max_tp=max_tp, **bounded)
                rows.append({"gpu": name, "best": out["best"][0], "evaluated": out["evaluated"],
                             "feasible": out["feasible"], "reason": None})
            else:
                out = min_gpus(plan, fixed, days, max_tp=max_tp, total_seconds=left, **limits)
                rows.append({"gpu": name, "best": out["best"], "tried": out["tried"], "reason": None})
        except PlanError as err:
            rows.append({"gpu": name, "best": None, "reason": str(err)})

    def rank(row):
        b = row["best"]
        if b is None:
            return (2, 0.0, 0.0)
        cost = b["training"]["cost_usd"]
        if objective == "cost":
            return (0, cost, 0.0) if cost is not None else (1, -b["time"]["tokens_per_s"], 0.0)
        if days is not None:
            return (0, b["gpu"]["gpus"], b["training"]["days"])
        return (0, -b["time"]["tokens_per_s"], 0.0)

    rows.sort(key=rank)
    return {"objective": objective, "deadline_days": days, "price": plans[0].price if plans else None, "rows": rows}


def accelerator_plans(options: dict, accelerators: str | list[str]) -> list[Plan]:
    """One plan per accelerator named in `accelerators` ("H100-SXM,MI300X", a list, or "all":
    the whole catalog), each built from the same `options` (make_plan's) so that what the
    options leave to the accelerator (the framework's attention kernel) is decided for each."""
    from ..plan import make_plan
    from ..specs import catalog

    if isinstance(accelerators, str):
        accelerators = [a.strip() for a in accelerators.split(",") if a.strip()]
    if [a.lower() for a in accelerators] == ["all"]:
        names = [g.name for g in catalog.gpus()]
    elif "all" in (a.lower() for a in accelerators):
        raise PlanError("compare_gpus", "all stands alone (every accelerator of the catalog); or name them")
    else:
        names = []
        for a in accelerators:
            try:
                name = catalog.gpu(a).name
            except PlanError as err:
                raise PlanError("compare_gpus", err.rule) from None
            if name not in names:
                names.append(name)
    if len(names) < 2:
        raise PlanError("compare_gpus", "name two accelerators or more, comma-separated (or all)")
    # a measured profile prices its own accelerator (and those of the same chip, which share its
    # efficiencies); the others keep their catalog defaults
    profile, profiled = options.get("gpu_profile"), None
    if profile:
        from ..profile import profile_accelerator
        from ..specs.conventions import shares_efficiency_defaults

        profiled = profile_accelerator(profile)
        if profiled is None:
            raise PlanError("gpu_profile", "names no accelerator (its gpu key): a comparison prices only the "
                            "accelerator a profile was measured on with it")
    return [make_plan(**{**options, "gpu": name, "gpu_profile": profile if profiled and
                         shares_efficiency_defaults(profiled, name) else None}) for name in names]


# `from trainplan import search` is also the Python API's function (trainplan/api.py)
from ..api import make_callable  # noqa: E402

make_callable(__name__)
