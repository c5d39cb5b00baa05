"""Catalogs of models and accelerators: one TOML file per entry, each with a `source`."""

from __future__ import annotations

import difflib
import tomllib
from functools import cache
from pathlib import Path

from pydantic import ValidationError

from ..errors import PlanError, from_pydantic
from .hardware import GPUSpec
from .model import ModelSpec

CATALOG_DIR = Path(__file__).parent / "catalog"


def _key(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(" ", "-")


def read_toml(path: Path, field: str) -> dict:
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise PlanError(field, f"{path} is not valid TOML ({exc})") from None
    except OSError as exc:
        raise PlanError(field, f"cannot read {path} ({exc.strerror})") from None


@cache
def _load(kind: str) -> dict[str, ModelSpec | GPUSpec]:
    cls = ModelSpec if kind == "models" else GPUSpec
    entries: dict[str, ModelSpec | GPUSpec] = {}
    for path in sorted((CATALOG_DIR / kind).glob("*.toml")):
        data = read_toml(path, kind)
        try:
            spec = cls(**data)
        except ValidationError as exc:  # a broken catalog file is a bug; say where
            raise PlanError(f"{kind}/{path.name}", str(from_pydantic(exc))) from None
        for alias in (spec.name, *getattr(spec, "aliases", ())):
            entries[_key(alias)] = spec
    return entries


def _lookup(kind: str, field: str, name: str):
    entries = _load(kind)
    spec = entries.get(_key(name))
    if spec is None:
        names = sorted({s.name for s in entries.values()})
        close = difflib.get_close_matches(_key(name), list(entries), n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise PlanError(field, f"unknown {field} '{name}'{hint}; see `trainplan {kind if kind == 'models' else 'gpus'}` "
                        f"for the {len(names)} known ones")
    return spec


def models() -> list[ModelSpec]:
    return sorted({id(s): s for s in _load("models").values()}.values(), key=lambda s: (s.family, s.params))


def gpus() -> list[GPUSpec]:
    return sorted({id(s): s for s in _load("hardware").values()}.values(), key=lambda s: s.name)


def model(name: str) -> ModelSpec:
    return _lookup("models", "model", name)


def gpu(name: str) -> GPUSpec:
    return _lookup("hardware", "gpu", name)
