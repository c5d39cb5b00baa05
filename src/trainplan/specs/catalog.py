"""Catalogs of models and accelerators: one TOML file per entry, each with a `source`.

The specs (pydantic models) are imported when a spec is first built: listing the catalog
(`model_rows`, `gpu_rows`) reads rows kept beside the catalog index and needs neither pydantic
nor numpy.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import PlanError
from ..files import read_toml_file
from .index import CATALOG_DIR as CATALOG_DIR  # the catalog's folder, for its other readers
from .index import cached_listing, catalog_files

if TYPE_CHECKING:
    from .hardware import GPUSpec
    from .model import ModelSpec


def _key(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(" ", "-")


def read_toml(path: Path, field: str) -> dict:
    """A TOML file (a catalog entry, a user's spec or profile), or a PlanError naming `field`."""
    return read_toml_file(path, field)


class _Entries:
    """{name or alias key: spec} of one kind, each spec validated when first looked up (a
    command needs one model and one accelerator, not the whole catalog)."""

    def __init__(self, kind: str):
        if kind == "models":
            from .model import ModelSpec as cls
        else:
            from .hardware import GPUSpec as cls
        self.kind = kind
        self.cls = cls
        self.files: dict[str, str] = {}  # key -> relative path of its file
        self.specs: dict[str, ModelSpec | GPUSpec] = {}  # relative path -> validated spec
        for rel, data in catalog_files().items():
            if rel.startswith(kind + "/"):
                for alias in (data.get("name", ""), *data.get("aliases", ())):
                    if isinstance(alias, str):
                        self.files[_key(alias)] = rel

    def spec(self, rel: str):
        spec = self.specs.get(rel)
        if spec is None:
            from pydantic import ValidationError

            from ..errors import from_pydantic

            try:
                spec = self.cls(**catalog_files()[rel])
            except ValidationError as exc:  # a broken catalog file is a bug; say where
                raise PlanError(rel, str(from_pydantic(exc))) from None
            self.specs[rel] = spec
        return spec

    def get(self, key, default=None):
        rel = self.files.get(key)
        return default if rel is None else self.spec(rel)

    def __contains__(self, key) -> bool:
        return key in self.files

    def __iter__(self):
        return iter(self.files)

    def __len__(self) -> int:
        return len(self.files)

    def values(self):
        return [self.spec(rel) for rel in self.files.values()]



@cache
def _load(kind: str) -> _Entries:
    return _Entries(kind)


def _lookup(kind: str, field: str, name: str):
    entries = _load(kind)
    spec = entries.get(_key(name))
    if spec is None:
        import difflib

        names = sorted({s.name for s in entries.values()})
        close = difflib.get_close_matches(_key(name), list(entries), n=3) if len(name) <= 100 else []
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        shown = repr(name) if len(name) <= 100 else f"{name[:40]!r}... ({len(name):,} characters)"
        raise PlanError(field, f"unknown {field} {shown}{hint}; see `trainplan {kind if kind == 'models' else 'gpus'}` "
                        f"for the {len(names)} known ones")
    return spec


def models() -> list[ModelSpec]:
    return sorted({id(s): s for s in _load("models").values()}.values(), key=lambda s: (s.family, s.params))


def gpus() -> list[GPUSpec]:
    return sorted({id(s): s for s in _load("hardware").values()}.values(), key=lambda s: s.name)


def model_rows() -> list[dict]:
    """`trainplan models`' rows, in models()' order: each entry's name, family, exact parameter
    counts (total and active), shape and source."""
    return cached_listing("models", lambda: [
        {"name": m.name, "family": m.family, "params": m.params, "active_params": m.active_params,
         "layers": m.layers, "hidden": m.hidden, "heads": m.heads, "kv_heads": m.n_kv_heads, "vocab": m.vocab,
         "experts": m.experts, "source": m.source} for m in models()])


def gpu_rows() -> list[dict]:
    """`trainplan gpus`' rows, in gpus()' order: each accelerator's spec, every field (defaults
    filled), as its model_dump()."""
    return cached_listing("hardware", lambda: [g.model_dump() for g in gpus()])


def model(name: str) -> ModelSpec:
    return _lookup("models", "model", name)


def gpu(name: str) -> GPUSpec:
    return _lookup("hardware", "gpu", name)


def check_kinds(data: dict, cls, prefix: str) -> None:
    """A spec file's values are of their field's kind: true / false only for a flag, whole numbers
    for a count (pydantic alone would read `layers = true` as 1 and `layers = 2.0` as 2)."""
    for key, value in data.items():
        field = cls.model_fields.get(key)
        kind = str(field.annotation) if field else ""
        if isinstance(value, bool) and "bool" not in kind and kind:
            raise PlanError(prefix + key, f"is not a flag: true or false is no value for it (got {str(value).lower()})")
        if isinstance(value, float) and "int" in kind and "float" not in kind:
            raise PlanError(prefix + key, f"must be an integer (got {value!r})")


# The largest model trainplan plans: 100 trillion parameters, some 50 times the largest in the
# catalog; past it a spec is a typo (an extra zero or two), and its figures would be meaningless.
MAX_PARAMS = 1e14
SIZE_FIELDS = ("layers", "hidden", "heads", "kv_heads", "head_dim", "ffn", "vocab", "max_position", "experts",
               "expert_ffn", "shared_experts", "shared_expert_ffn", "q_lora_rank", "kv_lora_rank",
               "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")


@cache
def _largest(field: str) -> int:
    return max([getattr(m, field) or 0 for m in models()] + [1])


def _fast_params(spec: ModelSpec) -> int:
    """spec.params without a pass over every layer: a layer's count depends only on whether it is
    an MoE layer."""
    moe = spec.n_moe_layers
    per = {flag: spec.layer_params(i) for flag in (False, True) if (i := spec.first_layer(flag)) is not None}
    return spec.embedding_params + spec.head_params + moe * per.get(True, 0) + (spec.layers - moe) * per.get(False, 0)


def size_problem(spec: ModelSpec) -> tuple[str, str] | None:
    """(field, rule) when a spec has more than MAX_PARAMS parameters, blaming the field furthest
    above the catalog's largest value for it; None otherwise."""
    params = _fast_params(spec)
    if params <= MAX_PARAMS:
        return None
    fields = [f for f in SIZE_FIELDS if getattr(spec, f) and (f != "max_position" or spec.position == "learned")]
    field = max(fields, key=lambda f: getattr(spec, f) / _largest(f))
    return field, (f"{getattr(spec, field):,} makes a model of {params:.3g} parameters, over the {MAX_PARAMS:.0e} "
                   f"parameters trainplan plans (the catalog's largest {field} is {_largest(field):,})")


def check_size(spec: ModelSpec, prefix: str = "model.") -> ModelSpec:
    """The spec, or a PlanError when it is larger than MAX_PARAMS (see size_problem)."""
    problem = size_problem(spec)
    if problem:
        raise PlanError(prefix + problem[0], problem[1])
    return spec
