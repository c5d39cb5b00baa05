"""How far to trust a predicted step: the time model's error on published runs (docs/accuracy.md).

`scripts/accuracy_report.py` compares every published run in benchmarks/data/published_runs.toml
with its prediction and writes the error per accelerator to catalog/accuracy.toml (a test keeps
the two equal). A plan on an accelerator with published runs reports their mean and worst
absolute error; one that takes the same measured efficiency defaults as a compared accelerator
(H200 and H800 share the H100's) reports that accelerator's; any other has no published
comparison, and a plan priced from a measured profile is not the catalog defaults compared.
"""

from __future__ import annotations

import tomllib
from functools import lru_cache

from ..plan import conventions
from ..specs import catalog

ACCURACY_FILE = catalog.CATALOG_DIR / "accuracy.toml"


@lru_cache(maxsize=1)
def published_errors() -> dict:
    """The generated error table: {gpu name: {runs, fitted_runs, mean_abs_error, worst_abs_error}}."""
    with open(ACCURACY_FILE, "rb") as fh:
        return tomllib.load(fh)["gpus"]


def _defaults(name: str) -> tuple | None:
    """The measured efficiency defaults an accelerator is priced with, or None where it has no
    measured GEMM figure of its own (the generic defaults say nothing about one another)."""
    eff = conventions()["efficiency"]
    if name not in eff["gemm"]:
        return None
    frac = eff["gemm_training_fraction"].get(name, eff["gemm_training_fraction_of_mamf"])
    return (eff["gemm"][name], frac, eff["gemm_shape"].get(name), eff["flash_attention"].get(name),
            eff["flash_attention_curve"].get(name), eff["cudnn_attention_curve"].get(name))


def shares_efficiency_defaults(a: str, b: str) -> bool:
    """Whether two accelerators are priced with the same measured efficiency defaults (one chip:
    H100, H200 and H800), so that fractions of the datasheet measured on one hold for the other."""
    mine = _defaults(a)
    return a == b or (mine is not None and _defaults(b) == mine)


def prediction_accuracy(gpu_name: str, profiled: bool = False, moe: bool = False, finetune: str = "full") -> dict:
    """What the published comparison says about a plan on `gpu_name`: the runs compared and the
    mean and worst absolute error of their predicted throughput (fractions), with the
    accelerator they ran on; `compared_on` is None where no published run backs the figures.
    Every published run trains in full, and few are mixtures of experts: a LoRA / QLoRA plan, or
    a mixture-of-experts plan where no such run backs the figures, carries `beyond`: what of it
    the comparison does not cover ("moe", "lora", "qlora")."""
    def _answer(basis: str, compared_on: str | None, figures: dict) -> dict:
        beyond = [what for what, on in (("moe", moe and not figures.get("moe_runs")),
                                         (finetune, finetune != "full")) if on]
        return {"compared_on": compared_on, "basis": basis, **figures, **({"beyond": beyond} if beyond else {}),
                **({"moe_plan": True} if moe else {})}

    if profiled:
        return _answer("profile", None, {})
    table = published_errors()
    if gpu_name in table:
        return _answer("published runs", gpu_name, table[gpu_name])
    for other, figures in table.items():
        if shares_efficiency_defaults(gpu_name, other):
            return _answer("shared defaults", other, figures)
    return _answer("none", None, {})
