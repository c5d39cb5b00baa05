"""The model a plan names: a catalog entry, a spec file, or a Hugging Face config (a path, or a
repository in the local Hub cache)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import ValidationError

from ..errors import PlanError, from_pydantic
from ..files import looks_like_path, shown_path
from ..specs import catalog, hf_cache
from ..specs.model import ModelSpec
from .options import Plan


@lru_cache(maxsize=256)
def _model_from_file(path: str, mtime_ns: int, size: int) -> ModelSpec:
    """Parse a spec file; cached per (path, modification time, size) so edits are seen."""
    p = Path(path)
    if p.suffix == ".toml":
        data = catalog.read_toml(p, "model")
        catalog.check_kinds(data, ModelSpec, "model.")
        try:
            return catalog.check_size(ModelSpec(**data))
        except ValidationError as exc:
            raise from_pydantic(exc, "model.") from None
    from ..specs import hf

    return hf.from_file(p)


def _model_from_path(path: str) -> ModelSpec:
    try:
        st = Path(path).stat()
    except OSError as exc:
        raise PlanError("model", f"cannot read {shown_path(path)} ({exc.strerror or exc})") from None
    except ValueError as exc:  # a NUL byte in the name
        raise PlanError("model", f"cannot read {path!r} ({exc})") from None
    return _model_from_file(path, st.st_mtime_ns, st.st_size)


def _model_from_hub_cache(repo_id: str) -> ModelSpec:
    path = hf_cache.config_path(repo_id)
    st = path.stat()
    return _model_from_cached_config(repo_id, str(path), st.st_mtime_ns, st.st_size)


@lru_cache(maxsize=64)
def _model_from_cached_config(repo_id: str, path: str, mtime_ns: int, size: int) -> ModelSpec:
    from ..files import read_json_file
    from ..specs import hf

    return hf.from_dict(read_json_file(path, "model"), name=repo_id, source=f"Hugging Face config.json at {path}")


def load_model(plan: Plan) -> ModelSpec:
    if plan.hf_config is not None:
        from ..specs import hf

        return hf.from_dict(plan.hf_config, name=plan.hf_config.get("_name_or_path") or "custom")
    name = plan.model
    if hf_cache.is_repo_id(name):  # a Hugging Face model id: its config.json in the local cache
        return _model_from_hub_cache(name)
    if looks_like_path(name):  # never a file that merely shares a catalog name
        return _model_from_path(name)
    try:
        return catalog.model(name)
    except PlanError as err:
        if Path(name).is_file():
            raise PlanError("model", f"{err.rule}; to read the file {name}, give its path: ./{name}") from None
        raise
