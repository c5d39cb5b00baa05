"""How far to trust a predicted step: the time model's error on published runs (docs/accuracy.md).

`scripts/accuracy_report.py` compares every published run in benchmarks/data/published_runs.toml
with its prediction and writes the error per accelerator to catalog/accuracy.toml (a test keeps
the two equal). A plan on an accelerator with published runs reports their mean and worst
absolute error; one that takes the same measured efficiency defaults as a compared accelerator
(H200 and H800 share the H100's) reports that accelerator's; any other has no published
comparison, and a plan priced from a measured profile is not the catalog defaults compared.
"""

from __future__ import annotations

from ..specs.conventions import shares_efficiency_defaults
from ..specs.index import CATALOG_DIR, catalog_file

__all__ = ["ACCURACY_FILE", "prediction_accuracy", "published_errors", "shares_efficiency_defaults"]

ACCURACY_FILE = CATALOG_DIR / "accuracy.toml"


def published_errors() -> dict:
    """The generated error table: {gpu name: {runs, fitted_runs, mean_abs_error, worst_abs_error}}."""
    return catalog_file("accuracy.toml")["gpus"]


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
