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
    POST /api/export      the plan's run for a framework (plan options and "target": megatron,
                          deepspeed or torchtitan): {"target", "filename", "text"}
    POST /api/import      a pasted configuration ("text"; "name", its file name; "model" for a
                          DeepSpeed config): {"format", "options", "not_understood", "notes", "ignored"}
    GET  /docs/{name}.md  the project's documents the page cites (docs/accuracy.md ...), rendered;
                          404 where the server runs without its source tree
    GET  /openapi.json    the API's OpenAPI document

Bad input gets HTTP 422 with the field and the rule (`body`: what is read; `schemas`: the
request models /openapi.json publishes); bodies over MAX_BODY_BYTES get 413; a POST that is
not `application/json` gets 415 and one from another site's page (its Origin not this Host)
403; no file-system path is accepted from the web (models come from the catalog or
`hf_config`). Plans run in a thread pool, searches and comparisons in worker processes with
a bounded queue (503 with Retry-After beyond it): the event loop never computes (`pool`).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from html import escape
from importlib import resources
from pathlib import Path
from threading import Lock

from fastapi import APIRouter, FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse, JSONResponse, Response

from ..errors import PlanError
from . import jobs
from .body import LOOPBACK_HOSTS, MAX_BODY_BYTES, Refusal, check_headers, check_host, parse
from .jobs import COMPARE_MAX_SECONDS, SEARCH_MAX_LAYOUTS, SEARCH_MAX_SECONDS  # noqa: F401 (the API's limits)
from .pool import HeavyPool, cpu_threads
from .schemas import REQUESTS, SEARCH_MAX_TOP, validate  # noqa: F401

HEAVY_GRACE_S = 15.0  # past its own time bound, a search's worker is stopped after this much more
CACHE_MAX_BYTES = 64 * 1024 * 1024  # the answers kept, in all ...
CACHE_MAX_ENTRY_BYTES = 4 * 1024 * 1024  # ... and the largest kept (a large pipeline's plan is 2-4 MB)
STATIC = resources.files("trainplan.web") / "static"
# The documents the page links (docs/*.md of a source checkout or an editable install)
DOCS = Path(__file__).resolve().parents[3] / "docs"
DOC_NAMES = ("accuracy", "memory-model", "time-model", "validation", "sources")
MEDIA = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
         ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}


NOT_HERE = ("<!doctype html><meta charset=utf-8><title>trainplan</title><p>docs/{name} is not served here: "
            "this server runs without the project's source tree; read it in the repository's docs/ folder.")


def render_markdown(text: str, title: str) -> str:
    """A Markdown document as a page (markdown-it, which rich already brings; tables on)."""
    from markdown_it import MarkdownIt

    body = MarkdownIt("commonmark", {"html": False}).enable("table").render(text)
    style = ("body{font-family:system-ui,sans-serif;max-width:1100px;margin:16px auto;padding:0 12px}"
             "table{border-collapse:collapse;display:block;overflow-x:auto}"
             "td,th{border:1px solid #ccd;padding:2px 6px;font-size:13px}")
    return ("<!doctype html><html><head><meta charset=utf-8><meta name=viewport content='width=device-width, "
            f"initial-scale=1'><title>{escape(title)}</title><style>{style}</style></head><body>"
            f"<p><a href='/'>← trainplan</a></p>{body}</body></html>")


def _refused(err: Refusal | PlanError) -> JSONResponse:
    if isinstance(err, PlanError):
        err = Refusal(422, err.field, err.rule)
    return JSONResponse(status_code=err.status, content=err.content(), headers=err.headers)


class ResponseCache:
    """Plans are pure functions of their request bodies: identical requests (a shared URL, a
    language switch) reuse the serialized answer. Bounded LRU, in entries and in bytes; an answer over
    `max_entry_bytes` is not kept."""

    def __init__(self, size: int = 2048, max_bytes: int = CACHE_MAX_BYTES,
                 max_entry_bytes: int = CACHE_MAX_ENTRY_BYTES):
        self.size, self.max_bytes, self.max_entry_bytes = size, max_bytes, max_entry_bytes
        self.data: OrderedDict[bytes, bytes] = OrderedDict()
        self.bytes, self.lock = 0, Lock()

    def get(self, key: bytes):
        with self.lock:
            value = self.data.get(key)
            if value is not None:
                self.data.move_to_end(key)
            return value

    def put(self, key: bytes, value: bytes) -> None:
        if len(value) + len(key) > min(self.max_entry_bytes, self.max_bytes):
            return
        with self.lock:
            old = self.data.pop(key, None)
            if old is not None:
                self.bytes -= len(old) + len(key)
            self.data[key] = value
            self.bytes += len(value) + len(key)
            while len(self.data) > self.size or self.bytes > self.max_bytes:
                k, v = self.data.popitem(last=False)
                self.bytes -= len(v) + len(k)


async def _read(request: Request) -> bytes:
    """The raw body: a JSON POST from this origin, at most MAX_BODY_BYTES (Refusal otherwise)."""
    check_headers(request.headers)
    too_big = Refusal(413, "body", f"request body must be at most {MAX_BODY_BYTES} bytes")
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > MAX_BODY_BYTES:  # refuse before reading
        raise too_big
    raw = bytearray()
    async for chunk in request.stream():  # bounded read, whatever the headers claim
        raw += chunk
        if len(raw) > MAX_BODY_BYTES:
            raise too_big
    return bytes(raw)


def _openapi(app: FastAPI) -> dict:
    """The generated document, with each POST's request body: its model's schema."""
    if app.openapi_schema is None:
        doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        schemas = doc.setdefault("components", {}).setdefault("schemas", {})
        for kind, model in REQUESTS.items():
            schemas[model.__name__] = model.model_json_schema(ref_template="#/components/schemas/{model}")
            doc["paths"][f"/api/{kind}"]["post"]["requestBody"] = {"required": True, "content": {
                "application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}}
        app.openapi_schema = doc
    return app.openapi_schema


def create_app(heavy_workers: int | None = None, heavy_queue: int | None = None, isolate: bool = True,
               allowed_hosts: frozenset[str] | None = LOOPBACK_HOSTS) -> FastAPI:
    """The app. `heavy_workers` searches at once, `heavy_queue` more waiting (defaults: half the
    cores, twice that); `isolate`: run them in worker processes (False: threads);
    `allowed_hosts`: the names requests may address it by (None: any; default: loopback's)."""
    cache = ResponseCache()
    cpu = ThreadPoolExecutor(cpu_threads(), thread_name_prefix="trainplan-cpu")
    heavy = HeavyPool(heavy_workers, heavy_queue, isolate=isolate)

    @asynccontextmanager
    async def lifespan(_app):
        yield
        heavy.close()
        cpu.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="trainplan", version="0.1", docs_url=None, redoc_url=None, lifespan=lifespan,
                  description="Plan LLM training: memory per GPU and stage, step time, cost.")
    app.state.cache, app.state.cpu, app.state.heavy = cache, cpu, heavy
    app.openapi = lambda: _openapi(app)

    @app.middleware("http")
    async def host_names_this_server(request: Request, call_next):
        try:
            check_host(request.headers, allowed_hosts)
        except Refusal as refusal:
            return _refused(refusal)
        return await call_next(request)

    for router in (pages, catalogs, planning):
        app.include_router(router)
    return app


# ---- the page, its assets and the documents it cites
pages = APIRouter(include_in_schema=False)


@pages.get("/", response_class=HTMLResponse)
def index() -> HTMLResponse:
    return HTMLResponse((STATIC / "index.html").read_text(encoding="utf-8"))


@pages.get("/static/{name}")
def static(name: str) -> Response:
    suffix = name[name.rfind("."):] if "." in name else ""
    path = STATIC / name
    if "/" in name or ".." in name or suffix not in MEDIA or not path.is_file():
        return Response(status_code=404)
    return Response(path.read_bytes(), media_type=MEDIA[suffix])


@pages.get("/docs/{name}")
def document(name: str) -> Response:
    stem = name.removesuffix(".md")
    path = DOCS / f"{stem}.md"
    if not name.endswith(".md") or stem not in DOC_NAMES or not path.is_file():
        return HTMLResponse(NOT_HERE.format(name=escape(name[:80])), status_code=404)
    return HTMLResponse(render_markdown(path.read_text(encoding="utf-8"), f"trainplan — docs/{name}"))


# ---- the catalogs
catalogs = APIRouter()


@catalogs.get("/api/models")
def models() -> list[dict]:
    from ..specs import catalog

    return catalog.model_rows()  # the rows `trainplan models --json` prints


@catalogs.get("/api/gpus")
def gpus() -> list[dict]:
    from ..specs import catalog

    return catalog.gpu_rows()  # the rows `trainplan gpus --json` prints


# ---- plans, searches, comparisons, exports and imports: computed off the event loop (`pool`)
planning = APIRouter()


async def _on_cpu(request: Request, fn, *args):
    """fn(*args) in the app's thread pool."""
    return await asyncio.wrap_future(request.app.state.cpu.submit(fn, *args))


def _checked(kind: str, raw: bytes) -> tuple[dict, dict]:
    options, extras = validate(kind, parse(raw))
    if kind == "compare":
        jobs.compare_plans(options, extras["compare_gpus"])  # every accelerator named is known
    else:
        jobs.web_plan(options)
    return options, extras


async def _heavy_request(request: Request, kind: str) -> Response:
    """A search or a comparison, checked in the thread pool and run in the app's bounded pool."""
    try:
        options, x = await _on_cpu(request, _checked, kind, await _read(request))
        if kind == "search":
            args, seconds = (options, x["fixed"], x["top"], x["objective"]), SEARCH_MAX_SECONDS
        else:
            args, seconds = (options, x["compare_gpus"], x["fixed"], x["objective"]), COMPARE_MAX_SECONDS
        payload = await request.app.state.heavy.run(kind, args, seconds + HEAVY_GRACE_S)
    except (Refusal, PlanError) as err:
        return _refused(err)
    return Response(payload, media_type="application/json")


@planning.post("/api/search")
async def search_layouts(request: Request) -> Response:
    return await _heavy_request(request, "search")


@planning.post("/api/compare")
async def compare_accelerators(request: Request) -> Response:
    return await _heavy_request(request, "compare")


def _plan_answer(cache: ResponseCache, raw: bytes) -> bytes:
    options, extras = validate("plan", parse(raw))
    payload = jobs.plan_json(options, extras["timeline"], extras["explain"])
    cache.put(raw, payload)
    return payload


def _export_answer(raw: bytes) -> bytes:
    options, extras = validate("export", parse(raw))
    return jobs.export_json(options, extras["target"])


def _import_answer(raw: bytes) -> bytes:
    options, extras = validate("import", parse(raw))
    return jobs.import_json(extras["text"], extras["name"], options.get("model"))


async def _light_request(request: Request, answer) -> Response:
    """A request answered in the thread pool (`answer`: its raw body -> the JSON answer)."""
    try:
        payload = await _on_cpu(request, answer, await _read(request))
    except (Refusal, PlanError) as err:
        return _refused(err)
    return Response(payload, media_type="application/json")


@planning.post("/api/import")
async def import_config(request: Request) -> Response:
    return await _light_request(request, _import_answer)


@planning.post("/api/export")
async def export_run(request: Request) -> Response:
    return await _light_request(request, _export_answer)


@planning.post("/api/plan")
async def plan(request: Request) -> Response:
    cache = request.app.state.cache
    try:
        raw = await _read(request)
        # a plan is a pure function of its body: the same bytes (a shared URL, a language
        # switch) are answered from the cache, on the event loop (a dictionary look-up)
        payload = cache.get(raw) or await _on_cpu(request, _plan_answer, cache, raw)
    except (Refusal, PlanError) as err:
        return _refused(err)
    return Response(payload, media_type="application/json")


app = create_app()
