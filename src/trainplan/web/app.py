"""`trainplan serve`: the parallel-strategy explorer (a single page) and its JSON API.

    GET  /                the page (static, served from the package; no network needed)
    GET  /api/models      the model catalog
    GET  /api/gpus        the accelerator catalog
    POST /api/plan        a plan: the CLI's plan options as JSON keys (model or hf_config)
    POST /api/search      the best layouts that fit (plan options; "fixed": dimensions to keep,
                          "top", "objective"); bounded to 200,000 layouts and 5 s
    POST /api/compare     the best layout on each accelerator (plan options without "gpu";
                          "compare_gpus": names or "all", "fixed", "objective"); each search
                          bounded as /api/search's, all of them to COMPARE_MAX_SECONDS
    GET  /openapi.json    the API's OpenAPI document

Bad input gets HTTP 422 with the field and the rule; bodies over MAX_BODY_BYTES get 413;
no file-system path is accepted from the web (models come from the catalog or `hf_config`).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from importlib import resources
from threading import Lock

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from pydantic import ValidationError

from ..errors import PlanError, from_pydantic
from ..plan import Plan

MAX_BODY_BYTES = 256 * 1024  # a pasted config.json is a few KB
SEARCH_MAX_LAYOUTS = 200_000  # web searches are bounded in layouts ...
SEARCH_MAX_SECONDS = 5.0  # ... and in time (the best found so far is returned)
SEARCH_MAX_TOP = 20
COMPARE_MAX_SECONDS = 20.0  # a comparison's searches together (each still bounded as one search)
STATIC = resources.files("trainplan.web") / "static"
MEDIA = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
         ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}
# Options that would make the server read files: not accepted from the web.
PATH_FIELDS = ("gpu_profile",)


def _error(field: str, rule: str) -> JSONResponse:
    return JSONResponse(status_code=422, content={
        "field": field, "rule": rule,
        "detail": [{"loc": ["body", field], "msg": rule, "type": "plan_error"}]})


def _check_web_plan(body: dict) -> None:
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


def _fixed_dimensions(fixed) -> set[str]:
    from ..search import LAYOUT_DIMENSIONS

    if not isinstance(fixed, list) or not set(fixed) <= set(LAYOUT_DIMENSIONS):
        raise PlanError("fixed", f"must list layout dimensions to keep, from {', '.join(sorted(LAYOUT_DIMENSIONS))}")
    return set(fixed)


def _web_plan(body: dict) -> Plan:
    """The plan a request's options describe (empty values left to their defaults)."""
    _check_web_plan(body)
    try:
        return Plan(**{k: v for k, v in body.items() if v is not None and v != ""})
    except ValidationError as exc:
        raise from_pydantic(exc) from None


class ResponseCache:
    """Plans are pure functions of their options: identical requests (a shared URL, a language
    switch) reuse the serialized answer. Bounded LRU."""

    def __init__(self, size: int = 2048):
        self.size, self.data, self.lock = size, OrderedDict(), Lock()

    def get(self, key: str):
        with self.lock:
            value = self.data.get(key)
            if value is not None:
                self.data.move_to_end(key)
            return value

    def put(self, key: str, value: bytes) -> None:
        with self.lock:
            self.data[key] = value
            if len(self.data) > self.size:
                self.data.popitem(last=False)


def create_app() -> FastAPI:
    cache = ResponseCache()

    app = FastAPI(title="trainplan", version="0.1", docs_url=None, redoc_url=None,
                  description="Plan LLM training: memory per GPU and stage, step time, cost.")

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def index() -> HTMLResponse:
        return HTMLResponse((STATIC / "index.html").read_text(encoding="utf-8"))

    @app.get("/static/{name}", include_in_schema=False)
    def static(name: str) -> Response:
        suffix = name[name.rfind("."):] if "." in name else ""
        path = STATIC / name
        if "/" in name or ".." in name or suffix not in MEDIA or not path.is_file():
            return Response(status_code=404)
        return Response(path.read_bytes(), media_type=MEDIA[suffix])

    @app.get("/api/models")
    def models() -> list[dict]:
        from ..specs import catalog

        return [{"name": m.name, "family": m.family, "params": m.params, "active_params": m.active_params,
                 "layers": m.layers, "hidden": m.hidden, "heads": m.heads, "kv_heads": m.n_kv_heads,
                 "experts": m.experts, "source": m.source} for m in catalog.models()]

    @app.get("/api/gpus")
    def gpus() -> list[dict]:
        from ..specs import catalog

        return [g.model_dump() for g in catalog.gpus()]

    async def read_body(request: Request):
        """The JSON object of a request, or an error response (413 / 422)."""
        length = request.headers.get("content-length", "")
        too_big = JSONResponse(status_code=413, content={
            "field": "body", "rule": f"request body must be at most {MAX_BODY_BYTES} bytes"})
        if length.isdigit() and int(length) > MAX_BODY_BYTES:  # refuse before reading
            return None, too_big
        raw = b""
        async for chunk in request.stream():  # bounded read, whatever the headers claim
            raw += chunk
            if len(raw) > MAX_BODY_BYTES:
                return None, too_big
        try:
            body = json.loads(raw or b"{}")
        except json.JSONDecodeError as exc:
            return None, _error("body", f"must be a JSON object ({exc.msg})")
        if not isinstance(body, dict):
            return None, _error("body", "must be a JSON object of plan options")
        return body, None

    @app.post("/api/search")
    async def search_layouts(request: Request) -> Response:
        body, err = await read_body(request)
        if err is not None:
            return err
        top = body.pop("top", 5)
        fixed = body.pop("fixed", [])
        objective = body.pop("objective", "time")
        body.pop("timeline", None)
        try:
            if not isinstance(top, int) or not 1 <= top <= SEARCH_MAX_TOP:
                raise PlanError("top", f"must be an integer between 1 and {SEARCH_MAX_TOP}")
            fixed = _fixed_dimensions(fixed)
            p = _web_plan(body)
            from ..search import search

            data = search(p, fixed, top=top, objective=objective, max_layouts=SEARCH_MAX_LAYOUTS,
                          max_seconds=SEARCH_MAX_SECONDS)
        except PlanError as e:
            return _error(e.field, e.rule)
        return Response(json.dumps(data, separators=(",", ":")).encode(), media_type="application/json")

    @app.post("/api/compare")
    async def compare_accelerators(request: Request) -> Response:
        body, err = await read_body(request)
        if err is not None:
            return err
        accelerators = body.pop("compare_gpus", "all")
        fixed = body.pop("fixed", [])
        objective = body.pop("objective", "time")
        body.pop("timeline", None)
        try:
            if body.get("gpu") not in (None, ""):
                raise PlanError("compare_gpus", "replaces gpu: name every accelerator to compare in compare_gpus")
            if not isinstance(accelerators, (str, list)) or (
                    isinstance(accelerators, list) and not all(isinstance(a, str) for a in accelerators)):
                raise PlanError("compare_gpus", 'must be a list of accelerator names, or "all"')
            fixed = _fixed_dimensions(fixed)
            _web_plan(body)  # the options themselves, checked once
            from ..search import accelerator_plans, compare_gpus

            options = {k: v for k, v in body.items() if v is not None and v != ""}
            data = compare_gpus(accelerator_plans(options, accelerators), fixed, objective=objective,
                                max_layouts=SEARCH_MAX_LAYOUTS, max_seconds=SEARCH_MAX_SECONDS,
                                total_seconds=COMPARE_MAX_SECONDS)
        except PlanError as e:
            return _error(e.field, e.rule)
        return Response(json.dumps(data, separators=(",", ":")).encode(), media_type="application/json")

    @app.post("/api/plan")
    async def plan(request: Request) -> Response:
        body, err = await read_body(request)
        if err is not None:
            return err
        key = json.dumps(body, sort_keys=True, separators=(",", ":"))
        hit = cache.get(key)
        if hit is not None:
            return Response(hit, media_type="application/json")
        timeline = bool(body.pop("timeline", False))
        try:
            p = _web_plan(body)
            from ..report import evaluate, to_json

            result = evaluate(p)
            data = to_json(result)
            if timeline:
                data["timeline"] = _timeline(result)
        except PlanError as err:
            return _error(err.field, err.rule)
        payload = json.dumps(data, separators=(",", ":")).encode()
        cache.put(key, payload)
        return Response(payload, media_type="application/json")

    return app


def _timeline(result, max_micro_batches: int = 16) -> dict:
    """The simulated schedule of the first micro-batches, for the page to draw."""
    from ..estimate.pipeline import FWD_SHARE, simulate

    L, t = result.layout, result.time
    m = min(L.micro_batches, max_micro_batches)
    stage = t["per_microbatch_stage_s"]
    sim = simulate(L.plan.schedule, L.pp, m, [x * FWD_SHARE for x in stage], [x * (1 - FWD_SHARE) for x in stage],
                   vpp=L.vpp)
    return {"micro_batches": m, "step_s": sim.step_time, "bubble_fraction": sim.bubble_fraction,
            "ops": [[op.stage, op.kind, op.mb, op.start, op.end] for op in sim.ops]}


app = create_app()
