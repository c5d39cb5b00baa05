"""The web API's request bodies: the plan's options (`Plan`'s fields) and each endpoint's own.

The models are strict (a `true` is not the integer 1, a "8" is not 8: JSON has types) and
closed (an unknown key is refused by name); /openapi.json publishes them. `validate` checks a
parsed body against its endpoint's model and returns the plan options (empty values left to
their defaults) and the endpoint's own options. The web API never reads files: no
`gpu_profile`, and `model` is a catalog name unless the body carries `hf_config`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..errors import PlanError, from_pydantic
from ..limits import MAX_IMPORT_CHARS
from ..plan import Plan
from ..search import LAYOUT_DIMENSIONS, OBJECTIVES

SEARCH_MAX_TOP = 20
# Options that would make the server read files: not accepted from the web.
PATH_FIELDS = ("gpu_profile",)
PLAN_FIELDS = frozenset(Plan.model_fields)
STRICT = ConfigDict(extra="forbid", strict=True)


class PlanRequest(Plan):
    """POST /api/plan: the plan's options, and whether to add the simulated pipeline timeline."""

    model_config = STRICT
    timeline: bool = Field(default=False, description="add the simulated schedule of the first micro-batches")
    explain: bool = Field(default=False, description="add the peak stage's memory terms and the step's parts "
                          "(`plan --explain`'s numbers, as data)")


class _LayoutOptions(BaseModel):
    """What a search keeps and ranks by (/api/search and /api/compare)."""

    fixed: list[str] = Field(default_factory=list, description=f"layout dimensions to keep as given, from "
                             f"{', '.join(LAYOUT_DIMENSIONS)}")
    objective: Literal["time", "cost"] = Field(default="time", description="rank by speed or by the training's cost")
    timeline: bool = Field(default=False, description="accepted and ignored (the page sends its plan's options)")
    explain: bool = Field(default=False, description="accepted and ignored (the page sends its plan's options)")

    @field_validator("fixed")
    @classmethod
    def _dimensions(cls, v: list[str]) -> list[str]:
        if not set(v) <= set(LAYOUT_DIMENSIONS):
            raise ValueError(f"must list layout dimensions to keep, from {', '.join(sorted(LAYOUT_DIMENSIONS))}")
        return v

    @field_validator("objective", mode="before")
    @classmethod
    def _objective(cls, v):
        if not isinstance(v, str) or v not in OBJECTIVES:
            raise ValueError(f"must be one of {', '.join(OBJECTIVES)}")
        return v


class SearchRequest(Plan, _LayoutOptions):
    """POST /api/search: the plan's options (its layout the starting point), and the search's."""

    model_config = STRICT
    top: int = Field(default=5, ge=1, le=SEARCH_MAX_TOP, description="how many layouts to return, best first")


class CompareRequest(Plan, _LayoutOptions):
    """POST /api/compare: the plan's options without `gpu`, and the accelerators to compare."""

    model_config = STRICT
    compare_gpus: list[str] | str = Field(
        default="all", description='accelerator names (a list, or comma-separated), or "all": the whole catalog')

    @field_validator("compare_gpus", mode="before")
    @classmethod
    def _names(cls, v):
        if not isinstance(v, (str, list)) or (isinstance(v, list) and not all(isinstance(a, str) for a in v)):
            raise ValueError('must be a list of accelerator names, or "all"')
        return v


class ExportRequest(Plan):
    """POST /api/export: the plan's options, and the framework to write its run for."""

    model_config = STRICT
    target: str = Field(description="megatron, deepspeed or torchtitan: planned under that framework's conventions "
                        "(the plan's framework must be the target's: deepspeed, megatron or fsdp)")
    timeline: bool = Field(default=False, description="accepted and ignored (the page sends its plan's options)")
    explain: bool = Field(default=False, description="accepted and ignored (the page sends its plan's options)")


class ImportRequest(BaseModel):
    """POST /api/import: a Megatron-LM launch script or arguments, a DeepSpeed JSON config (with
    the catalog model it trains) or a torchtitan job config, pasted as text."""

    model_config = STRICT
    text: str = Field(min_length=1, max_length=MAX_IMPORT_CHARS, description="the configuration's text")
    name: str = Field(default="config", pattern=r"^[\w.\-]{1,100}$",
                      description="its file name, whose suffix may tell the format (.sh, .json, .toml)")
    model: str | None = Field(default=None, description="a catalog model: the one a DeepSpeed config trains, or "
                              "one that replaces the file's")


REQUESTS: dict[str, type[BaseModel]] = {"plan": PlanRequest, "search": SearchRequest, "compare": CompareRequest,
                                        "export": ExportRequest, "import": ImportRequest}


def _check_shapes(body: dict) -> None:
    """Types the plan's own parsing takes for granted (its validators split a string or walk a
    list; a number there is refused here by name)."""
    for field in ("lora_targets", "stage_layers"):
        value = body.get(field)
        if value is not None and not isinstance(value, (str, list)):
            raise PlanError(field, "must be a list, or a comma-separated string")
    if field := next((f for f in ("lora_targets",) if isinstance(body.get(f), list)
                      and not all(isinstance(t, str) for t in body[f])), None):
        raise PlanError(field, "must list names (strings)")
    cfg = body.get("hf_config")
    if isinstance(cfg, dict) and "model_type" in cfg and not isinstance(cfg["model_type"], str):
        raise PlanError("hf_config.model_type", "must be a string (the config.json's model_type)")


def _check_no_files(body: dict) -> None:
    for field in PATH_FIELDS:
        if body.get(field) not in (None, ""):
            raise PlanError(field, "file paths are not accepted by the web API")
    model = body.get("model")
    if isinstance(model, str) and ("/" in model or "\\" in model or model.endswith((".json", ".toml"))):
        raise PlanError("model", "file paths are not accepted by the web API; pick a catalog model "
                        "or send the config.json object as hf_config")
    if isinstance(model, str) and body.get("hf_config") is None:
        from ..specs import catalog

        catalog.model(model)  # the web takes catalog names only (never a file in the server's cwd)


def validate(kind: str, body: dict) -> tuple[dict, dict]:
    """(plan options, the endpoint's own options) of a parsed body, or a PlanError naming the
    field. Empty values ("" or null) leave an option to its default, as the page sends them."""
    body = {k: v for k, v in body.items() if v is not None and v != ""}
    _check_no_files(body)
    _check_shapes(body)
    model = REQUESTS[kind]
    unknown = next((k for k in body if k not in model.model_fields), None)
    if unknown is not None:  # named as sent (an empty key as JSON spells it)
        raise PlanError(unknown or '""', "Extra inputs are not permitted")
    try:
        request = model.model_validate(body)
    except ValidationError as exc:
        raise from_pydantic(exc) from None
    options = {k: v for k, v in body.items() if k in PLAN_FIELDS}
    extras = {k: getattr(request, k) for k in model.model_fields if k not in PLAN_FIELDS}
    return options, extras


def web_plan(options: dict) -> Plan:
    """The Plan of validated options."""
    try:
        return Plan(**options)
    except ValidationError as exc:
        raise from_pydantic(exc) from None
