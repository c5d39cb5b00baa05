"""The catalog's conventions (conventions.toml): framework byte conventions, runtime defaults,
efficiency defaults, search defaults. Specs-level facts that plan and estimate both read."""

from __future__ import annotations

from .index import catalog_file


def conventions() -> dict:
    """conventions.toml, parsed (through the catalog index: parsed once per catalog change)."""
    return catalog_file("conventions.toml")


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
