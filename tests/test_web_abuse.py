"""The web API under hostile input: every malformed body is a 422 naming the field (never a
500), other sites' pages cannot drive it, its cache is bounded in bytes, heavy work is shed
rather than queued without end and runs off the event loop. Ends with a fuzz test over the
API's bodies."""

import asyncio
import http.client
import json
import math
import os
import socket
import threading
import time
import typing
from pathlib import Path

import pytest

fastapi = pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from trainplan.plan import Plan  # noqa: E402
from trainplan.web import body as web_body  # noqa: E402
from trainplan.web import jobs  # noqa: E402
from trainplan.web.app import ResponseCache, create_app  # noqa: E402
from trainplan.web.body import MAX_DEPTH, MAX_INT_DIGITS, Refusal  # noqa: E402

JSON = {"content-type": "application/json"}
client = TestClient(create_app(), base_url="http://127.0.0.1", raise_server_exceptions=False)
SMALL = {"model": "llama-3-8b", "gpus": 8}


def _refused(res, status: int, field: str, words: str = "", where: str = "body") -> dict:
    assert res.status_code == status, res.text
    data = res.json()
    assert data["field"] == field and words in data["rule"], data
    assert data["detail"][0]["loc"] == [where, field]
    return data


# ---- bodies that used to be 500s -------------------------------------------------------
def test_integer_past_pythons_digit_limit_is_422_naming_the_field():
    raw = b'{"model":"llama-3-8b","gpus":' + b"9" * 4301 + b"}"
    _refused(client.post("/api/plan", content=raw, headers=JSON), 422, "gpus", f"at most {MAX_INT_DIGITS} digits")
    # inside a config.json too, named by its path
    raw = b'{"hf_config":{"model_type":"llama","vocab_size":-' + b"1" * 5000 + b"}}"
    _refused(client.post("/api/plan", content=raw, headers=JSON), 422, "hf_config.vocab_size")


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 1000, 100_000])
def test_deep_nesting_is_422(depth):
    raw = b'{"hf_config":' + b"[" * depth + b"]" * depth + b"}"
    _refused(client.post("/api/plan", content=raw, headers=JSON), 422, "body", f"at most {MAX_DEPTH} levels")


def test_brackets_inside_strings_do_not_count_as_nesting():
    raw = json.dumps({"model": "[" * 1000}).encode()
    _refused(client.post("/api/plan", content=raw, headers=JSON), 422, "model", "unknown model")
    # an unterminated string of escaped quotes is read in linear time and refused as JSON
    raw = b'{"model":"' + b'\\"' * 100_000
    _refused(client.post("/api/plan", content=raw, headers=JSON), 422, "body", "must be a JSON object")


@pytest.mark.parametrize("literal", [b"NaN", b"Infinity", b"-Infinity", b"1e999"])
def test_non_finite_numbers_are_refused_by_name(literal):
    raw = b'{"model":"llama-3-8b","grad_clip":' + literal + b"}"
    _refused(client.post("/api/plan", content=raw, headers=JSON), 422, "grad_clip", "must be a finite number")


@pytest.mark.parametrize("path,body,field,words", [
    ("/api/plan", {"hf_config": {"model_type": ["llama"]}}, "hf_config.model_type", "must be a string"),
    ("/api/plan", {**SMALL, "lora_targets": 5}, "lora_targets", "must be a list"),
    ("/api/plan", {**SMALL, "lora_targets": [1]}, "lora_targets", "must list names"),
    ("/api/plan", {**SMALL, "stage_layers": {"a": 1}}, "stage_layers", "must be a list"),
    ("/api/plan", {**SMALL, "gpus": True}, "gpus", "valid integer"),  # true is not 1
    ("/api/plan", {**SMALL, "gpus": "8"}, "gpus", "valid integer"),
    ("/api/plan", {**SMALL, "timeline": "yes"}, "timeline", "valid boolean"),
    ("/api/plan", {**SMALL, "timeline": 1}, "timeline", "valid boolean"),
    ("/api/search", {**SMALL, "fixed": [[]]}, "fixed.0", "valid string"),
    ("/api/compare", {**SMALL, "fixed": [[]]}, "fixed.0", "valid string"),
    ("/api/search", {**SMALL, "fixed": "tp"}, "fixed", "valid list"),
    ("/api/search", {**SMALL, "top": True}, "top", "valid integer"),
    ("/api/search", {**SMALL, "top": 21}, "top", "less than or equal to 20"),
    ("/api/search", {**SMALL, "objective": 5}, "objective", "must be one of time, cost"),
    ("/api/compare", {**SMALL, "objective": ["time"]}, "objective", "must be one of time, cost"),
    ("/api/compare", {**SMALL, "compare_gpus": [["H100-SXM"]]}, "compare_gpus", "list of accelerator names"),
    ("/api/compare", {**SMALL, "compare_gpus": {"H100-SXM": 1}}, "compare_gpus", "list of accelerator names"),
    ("/api/compare", {**SMALL, "compare_gpus": ["H100-SXM", "nope"]}, "compare_gpus", "unknown"),
    ("/api/compare", {**SMALL, "top": 1}, "top", "Extra inputs are not permitted"),
])
def test_wrong_types_are_422_naming_the_field(path, body, field, words):
    _refused(client.post(path, json=body), 422, field, words)


def test_a_body_that_is_not_an_object_is_422():
    for raw in (b"[]", b"5", b'"x"', b"\xff\xfe", b"{"):
        _refused(client.post("/api/plan", content=raw, headers=JSON), 422, "body")


def test_an_answer_never_carries_nan():
    """A figure that is not finite is a 422 naming it, never `NaN` in the JSON."""
    with pytest.raises(Refusal) as err:
        web_body.dumps({"time": {"step_s": 1.0, "breakdown_s": {"dp_comm": math.inf}}})
    assert (err.value.status, err.value.field) == (422, "time.breakdown_s.dp_comm")
    assert web_body.dumps({"a": [1, 2.5]}) == b'{"a":[1,2.5]}'


def test_a_refusal_keeps_the_connection_alive():
    """On a real server: refused bodies (each once a 500 that closed the connection) and then a
    plan, all on one keep-alive connection."""
    uvicorn = pytest.importorskip("uvicorn")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(isolate=False), host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        for _ in range(200):
            if server.started:
                break
            time.sleep(0.05)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        bad = [b'{"gpus":' + b"9" * 5000 + b"}", b"[" * 2000, b'{"hf_config":{"model_type":[]}}',
               b'{"model":"llama-3-8b","lora_targets":5}', b'{"grad_clip":Infinity}']
        for raw in bad:
            conn.request("POST", "/api/plan", raw, {"Content-Type": "application/json"})
            res = conn.getresponse()
            assert res.status == 422 and json.loads(res.read())["field"]
            assert not res.will_close
        sock = conn.sock
        conn.request("POST", "/api/plan", json.dumps(SMALL), {"Content-Type": "application/json"})
        res = conn.getresponse()
        assert res.status == 200 and json.loads(res.read())["gpu"]["gpus"] == 8
        assert conn.sock is sock  # the same connection throughout
        conn.close()
    finally:
        server.should_exit = True
        thread.join(10)


# ---- other sites' pages ----------------------------------------------------------------
@pytest.mark.parametrize("ctype", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data", None])
def test_a_post_that_is_not_json_is_415(ctype):
    headers = {"content-type": ctype} if ctype else {}
    res = client.post("/api/search", content=json.dumps(SMALL).encode(), headers=headers)
    _refused(res, 415, "content-type", "must be application/json", where="header")


@pytest.mark.parametrize("origin", ["http://evil.example", "null", "http://127.0.0.1.evil.example",
                                    "http://127.0.0.1:8080"])
def test_another_origin_is_403(origin):
    res = client.post("/api/plan", json=SMALL, headers={"origin": origin})
    _refused(res, 403, "origin", "is not this server", where="header")


def test_the_explorers_own_origin_is_served():
    res = client.post("/api/plan", json=SMALL, headers={"origin": "http://127.0.0.1"})
    assert res.status_code == 200 and res.json()["parallel"]["dp"] == 8
    assert client.post("/api/plan", json=SMALL).status_code == 200  # no Origin: a script, curl


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8000", "127.0.0.1.evil.example", ""])
def test_a_host_name_that_is_not_this_servers_is_refused(host):
    """DNS rebinding: another site re-points its own name at 127.0.0.1; its page's requests
    then carry a matching Origin and Host, and only the Host's name gives them away."""
    for method, path in (("post", "/api/plan"), ("get", "/api/models"), ("get", "/")):
        kwargs = {"json": SMALL} if method == "post" else {}
        headers = {"host": host, "origin": f"http://{host}"} if host else {"host": ""}
        res = getattr(client, method)(path, headers=headers, **kwargs)
        _refused(res, 421, "host", "is not a name of this server", where="header")


@pytest.mark.parametrize("host", ["localhost:8000", "127.0.0.1", "[::1]:8000"])
def test_loopback_names_are_served(host):
    res = client.post("/api/plan", json=SMALL, headers={"host": host, "origin": f"http://{host}"})
    assert res.status_code == 200


def test_a_server_on_every_interface_takes_any_host():
    open_client = TestClient(create_app(isolate=False, allowed_hosts=None), base_url="http://planner.lan")
    assert open_client.post("/api/plan", json=SMALL).status_code == 200


def test_the_page_posts_json():
    js = (Path(__file__).resolve().parents[1] / "src/trainplan/web/static/app.js").read_text()
    posts = js.count('method: "POST"')
    # the plan, the search and comparison (one helper), the export, the import
    assert posts == 4 and js.count('headers: { "Content-Type": "application/json" }') == posts


# ---- the answer cache ------------------------------------------------------------------
def test_cache_bounded_in_bytes_and_entries():
    cache = ResponseCache(size=100, max_bytes=1000, max_entry_bytes=300)
    for i in range(20):
        cache.put(b"k%02d" % i, b"x" * 197)  # 3 + 197 = 200 bytes each
    assert cache.bytes == 1000 and len(cache.data) == 5  # the 5 newest fit exactly
    assert list(cache.data) == [b"k%02d" % i for i in range(15, 20)]
    assert cache.bytes == sum(len(k) + len(v) for k, v in cache.data.items())
    cache.put(b"big", b"x" * 298)  # 301 bytes: over the entry cap, not kept
    assert cache.get(b"big") is None and cache.bytes == 1000
    cache.put(b"k19", b"y" * 97)  # replacing an entry counts its new size
    assert cache.bytes == 900
    small = ResponseCache(size=3, max_bytes=10**6)
    for i in range(10):
        small.put(b"%d" % i, b"v")
    assert list(small.data) == [b"7", b"8", b"9"] and small.bytes == 6


def test_app_cache_serves_the_same_bytes_and_stays_under_its_cap():
    app = create_app()
    c = TestClient(app, base_url="http://127.0.0.1")
    cache = app.state.cache
    cache.max_bytes, cache.max_entry_bytes = 40_000, 20_000
    first = c.post("/api/plan", json=SMALL)
    assert c.post("/api/plan", json=SMALL).content == first.content
    for gbs in range(8, 8 * 40, 8):
        assert c.post("/api/plan", json={**SMALL, "gbs": gbs}).status_code == 200
        assert cache.bytes <= cache.max_bytes
    assert cache.bytes == sum(len(k) + len(v) for k, v in cache.data.items())
    assert all(len(k) + len(v) <= cache.max_entry_bytes for k, v in cache.data.items())


# ---- the schema ------------------------------------------------------------------------
def test_openapi_publishes_each_request_model():
    spec = client.get("/openapi.json").json()
    schemas = spec["components"]["schemas"]
    for path, name, own in (("/api/plan", "PlanRequest", {"timeline"}),
                            ("/api/search", "SearchRequest", {"top", "fixed", "objective"}),
                            ("/api/compare", "CompareRequest", {"compare_gpus", "fixed", "objective"})):
        body = spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert body == {"$ref": f"#/components/schemas/{name}"}
        props = schemas[name]["properties"]
        assert set(Plan.model_fields) | own <= set(props)
        assert schemas[name]["additionalProperties"] is False
    assert schemas["SearchRequest"]["properties"]["top"]["maximum"] == 20


# ---- responsiveness --------------------------------------------------------------------
def test_heavy_requests_are_shed_with_503_when_the_queue_is_full():
    app = create_app(heavy_workers=1, heavy_queue=1, isolate=False)
    c = TestClient(app, base_url="http://127.0.0.1")
    heavy = app.state.heavy
    with heavy.admit(), heavy.admit():  # one running, one waiting: full
        for path in ("/api/search", "/api/compare"):
            res = c.post(path, json=SMALL if path == "/api/search" else {"gpus": 8})
            _refused(res, 503, "server", "busy", where="server")
            assert res.headers["retry-after"] == "5"
        # cheap plans are not behind the heavy queue, and bad input is still told at once
        assert c.post("/api/plan", json=SMALL).status_code == 200
        _refused(c.post("/api/search", json={**SMALL, "top": 0}), 422, "top")
    assert heavy.pending == 0
    assert c.post("/api/search", json={**SMALL, "top": 1}).status_code == 200


def test_plans_run_on_the_cpu_pool_not_the_event_loop(monkeypatch):
    seen = []
    real = jobs.plan_json

    def spy(*args):
        seen.append(threading.current_thread().name)
        return real(*args)

    monkeypatch.setattr(jobs, "plan_json", spy)
    c = TestClient(create_app(), base_url="http://127.0.0.1")
    assert c.post("/api/plan", json={**SMALL, "gbs": 48}).status_code == 200
    assert len(seen) == 1 and seen[0].startswith("trainplan-cpu")


def test_searches_run_in_a_worker_process_that_a_deadline_stops():
    app = create_app(heavy_workers=1)
    c = TestClient(app, base_url="http://127.0.0.1")
    heavy = app.state.heavy
    res = c.post("/api/search", json={**SMALL, "top": 1})
    assert res.status_code == 200 and res.json()["best"][0]["gpu"]["gpus"] == 8
    (worker,) = heavy.idle
    assert heavy.started == 1 and worker.process.pid != os.getpid() and worker.process.poll() is None
    # a deadline of 0 s has passed before any answer can come: the worker is killed, 503
    with pytest.raises(Refusal) as err:
        asyncio.run(heavy.run("search", ({"model": "llama-3-8b", "gpus": 8}, [], 1, "time"), 0.0))
    assert err.value.status == 503 and "deadline" in err.value.rule
    assert worker.process.poll() is not None and heavy.idle == []
    assert c.post("/api/search", json={**SMALL, "top": 1}).status_code == 200  # a fresh worker
    assert heavy.started == 2
    heavy.close()


# ---- fuzz ------------------------------------------------------------------------------
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6)
HF_CONFIG = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 4,
             "intermediate_size": 512, "vocab_size": 1000}
NAMED = {"model": ["llama-3-8b", "gpt2-xl", "mixtral-8x7b", "nope"], "gpu": ["H100-SXM", "A100-80GB-SXM", "MI300X"]}


def _plausible(name: str, annotation):
    """Values of a Plan field's own type (so the fuzz reaches the planner, not just the parser)."""
    if name in NAMED:
        return st.sampled_from(NAMED[name])
    if name == "gpu_profile":
        return st.sampled_from([None, ""])
    if name == "hf_config":
        return st.just(HF_CONFIG) | st.dictionaries(st.sampled_from(sorted(HF_CONFIG)), JSON_VALUES, max_size=6)
    if name == "lora_targets":
        return st.lists(st.sampled_from(["q", "k", "v", "o", "gate", "up", "down", "x"]), max_size=3)
    args = [a for a in typing.get_args(annotation) if a is not type(None)] or [annotation]
    kind = args[0]
    if typing.get_origin(kind) is typing.Literal:
        return st.sampled_from(typing.get_args(kind))
    if kind is bool:
        return st.booleans()
    if kind is int:
        return st.integers(0, 64)
    if kind is float:
        return st.floats(0, 4, allow_nan=False)
    return JSON_VALUES


FIELDS = {name: _plausible(name, f.annotation) | JSON_VALUES for name, f in Plan.model_fields.items()}
EXTRAS = {"top": st.integers(0, 25) | JSON_VALUES, "fixed": st.lists(st.sampled_from(["tp", "pp", "zero", "x"]),
          max_size=3) | JSON_VALUES, "objective": st.sampled_from(["time", "cost"]) | JSON_VALUES,
          "timeline": st.booleans() | JSON_VALUES,
          "compare_gpus": st.sampled_from([["H100-SXM", "MI300X"], "all", "H100-SXM,A100-80GB-SXM"]) | JSON_VALUES}
ALL = {**FIELDS, **EXTRAS}
# a small plan with up to three options changed (most bodies reach the planner), or anything at all
BODIES = st.fixed_dictionaries({"model": st.sampled_from(["llama-3-8b", "gpt2-xl"]), "gpus": st.sampled_from([1, 8, 16])}
                               ).flatmap(lambda base: st.lists(st.sampled_from(sorted(ALL)), max_size=3, unique=True)
                                         .flatmap(lambda names: st.fixed_dictionaries(
                                             {**{k: st.just(v) for k, v in base.items()}, **{n: ALL[n] for n in names}})))
BODIES = BODIES | st.fixed_dictionaries({}, optional=ALL) | st.dictionaries(st.text(max_size=8), JSON_VALUES, max_size=3)


def _no_constants(name):
    raise AssertionError(f"{name} in an answer")


@pytest.fixture(scope="module")
def fuzz_client():
    """Searches in threads, with small bounds so that each example stays quick."""
    mp = pytest.MonkeyPatch()
    mp.setattr(jobs, "SEARCH_MAX_LAYOUTS", 20_000)
    mp.setattr(jobs, "SEARCH_MAX_SECONDS", 0.2)
    mp.setattr(jobs, "COMPARE_MAX_SECONDS", 0.5)
    yield TestClient(create_app(isolate=False), base_url="http://127.0.0.1", raise_server_exceptions=False)
    mp.undo()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                                  HealthCheck.function_scoped_fixture])
@given(path=st.sampled_from(["/api/plan", "/api/plan", "/api/search", "/api/compare"]), body=BODIES,
       extra=st.just({}) | st.dictionaries(st.text(max_size=8), JSON_VALUES, max_size=2))
def test_fuzz_bodies_are_answered_or_refused_by_name(fuzz_client, path, body, extra):
    res = fuzz_client.post(path, content=json.dumps({**extra, **body}).encode(), headers=JSON)
    assert res.status_code in {200, 413, 415, 422, 503}, (res.status_code, res.text[:500])
    if res.status_code == 200:
        json.loads(res.content, parse_constant=_no_constants)
    else:
        data = res.json()
        assert isinstance(data["field"], str) and data["field"] and data["rule"], data
