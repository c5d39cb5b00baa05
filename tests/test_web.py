"""The web API (FastAPI TestClient) and the explorer page in a real browser (Playwright
driving Debian's Chromium at /usr/bin/chromium, headless; no browser download)."""

import json
import os
import socket
import threading
import time
from pathlib import Path

import pytest

fastapi = pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from trainplan.plan import make_plan  # noqa: E402
from trainplan.report import evaluate, to_json  # noqa: E402
from trainplan.web.app import MAX_BODY_BYTES, create_app  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
# The README's screenshots are rewritten only when asked (TRAINPLAN_SCREENSHOTS=1), so that a
# test run leaves the checkout as it found it; otherwise they are taken into a temporary folder.
DOC_SHOTS = Path(__file__).resolve().parents[1] / "docs" / "screenshots"
client = TestClient(create_app(), base_url="http://127.0.0.1")


def test_api_plan_matches_cli_json():
    body = {"model": "llama-3-70b", "gpus": 64, "tp": 8, "pp": 4, "gbs": 64}
    res = client.post("/api/plan", json=body)
    assert res.status_code == 200
    data = res.json()
    want = to_json(evaluate(make_plan(**body)))
    assert data["memory"]["peak_bytes"] == pytest.approx(want["memory"]["peak_bytes"])
    assert data["time"]["step_s"] == pytest.approx(want["time"]["step_s"])
    assert set(data) >= {"model", "parallel", "memory", "time", "training", "warnings"}


@pytest.mark.parametrize("body,field,words", [
    ({"model": "llama-3-70b", "tp": 3}, "tp", "attention heads"),
    ({"model": "llama-3-8b", "mbs": -1}, "mbs", "greater than or equal to 1"),
    ({"model": "no-such-model"}, "model", "unknown model"),
    ({"model": "../../etc/passwd"}, "model", "file paths are not accepted"),
    ({"model": "pyproject"}, "model", "unknown model"),
    ({"gpu_profile": "/etc/hosts"}, "gpu_profile", "file paths are not accepted"),
    ({"hf_config": {"model_type": "bert"}}, "hf_config.model_type", "unsupported model_type"),
    ({"model": "llama-3-8b", "bogus": 1}, "bogus", "Extra inputs are not permitted"),
    ({"model": "llama-3-8b", "storage_gbs": 0}, "storage_gbs", "greater than or equal to 0.001"),
    ({"model": "llama-3-8b", "reduce_dtype": "fp8"}, "reduce_dtype", "'fp32', 'bf16' or 'fp16'"),
    ({"model": "llama-3-8b", "gpus": 8, "framework": "megatron", "reduce_dtype": "bf16"}, "reduce_dtype",
     "--grad-dtype bf16"),
    ({"model": "llama-3-8b", "backward_prefetch": "early"}, "backward_prefetch", "'pre', 'post' or 'none'"),
    ({"model": "llama-3-8b", "attention": "fa3"}, "attention", "'triton' or 'cudnn'"),
    ({"model": "llama-3-8b", "optimizer_impl": "apex"}, "optimizer_impl", "'fused', 'foreach' or 'for-loop'"),
    ({"model": "llama-3-8b", "gpus": 8, "framework": "fsdp", "zero": 1}, "zero", "2 = SHARD_GRAD_OP"),
    ({"model": "llama-3-8b", "gpus": 8, "zero": 3, "dp_shard": 3}, "dp_shard", "must divide dp (8)"),
    ({"model": "llama-3-8b", "optimizer_state_dtype": "fp8"}, "optimizer_state_dtype", "'fp32', 'bf16' or 'fp16'"),
])
def test_api_invalid_input_is_422_with_field_and_rule(body, field, words):
    res = client.post("/api/plan", json=body)
    assert res.status_code == 422
    data = res.json()
    assert data["field"] == field and words in data["rule"]
    assert data["detail"][0]["loc"] == ["body", field]


def test_api_cudnn_attention_speeds_hopper_and_warns_elsewhere():
    """cuDNN attention on H100 shortens the step (its published speed, 1.6x FA2 at 4K tokens);
    on an A100, with no published figure, the step is FA2's and the plan says so."""
    h100 = {"model": "llama-3-8b", "gpu": "H100-SXM", "gpus": 8, "seq_len": 8192}
    fa2, cudnn = (client.post("/api/plan", json={**h100, "attention": a}).json() for a in ("flash", "cudnn"))
    assert cudnn["time"]["step_s"] < fa2["time"]["step_s"]
    a100 = {**h100, "gpu": "A100-80GB-SXM"}
    fa2, cudnn = (client.post("/api/plan", json={**a100, "attention": a}).json() for a in ("flash", "cudnn"))
    assert cudnn["time"]["step_s"] == fa2["time"]["step_s"]
    assert [w["code"] for w in cudnn["warning_details"]] == ["cudnn_unpublished"]
    # left to "auto" (the page's default), a Megatron plan on H100 runs cuDNN, as Transformer Engine does
    auto = client.post("/api/plan", json={**h100, "framework": "megatron"}).json()
    assert auto["recipe"]["attention"] == "cudnn" and not auto["warning_details"]


def test_api_input_pipeline_and_sharp_reach_the_step():
    """The explorer's data and network fields: a slow tokenizer shows as waiting for data, and
    in-network all-reduce shortens the TP collectives."""
    base = {"model": "llama-3-70b", "gpus": 64, "tp": 8, "pp": 4, "gbs": 256, "sp": True}
    plain = client.post("/api/plan", json=base).json()["time"]
    slow = client.post("/api/plan", json={**base, "tokenize_rate": 2000, "data_workers": 2}).json()["time"]
    assert plain["breakdown_s"]["data"] == 0 and slow["breakdown_s"]["data"] > 0
    # 256 sequences of 4,096 tokens (the default length) over DP 2, tokenized by 2 workers at 2,000 tokens/s
    assert slow["input_pipeline_s"]["tokenize"] == pytest.approx(256 * 4096 / 2 / (2 * 2000), rel=1e-12)
    sharp = client.post("/api/plan", json={**base, "sharp": True}).json()["time"]
    assert sharp["breakdown_s"]["tp_comm"] < plain["breakdown_s"]["tp_comm"]
    overlapped = client.post("/api/plan", json={**base, "overlap_tp": True}).json()["time"]
    assert overlapped["breakdown_s"]["tp_comm"] < plain["breakdown_s"]["tp_comm"]


def test_api_hf_config_object(data_dir):
    cfg = json.loads((data_dir / "hf" / "mistral-7b.json").read_text())
    res = client.post("/api/plan", json={"hf_config": cfg, "gpus": 8})
    assert res.status_code == 200 and res.json()["model"]["params"] == 7_241_732_096


def test_api_body_size_capped_and_malformed():
    big = "x" * (MAX_BODY_BYTES + 10)
    res = client.post("/api/plan", content=json.dumps({"model": big}), headers={"content-type": "application/json"})
    assert res.status_code == 413
    res = client.post("/api/plan", content=b"{not json", headers={"content-type": "application/json"})
    assert res.status_code == 422 and res.json()["field"] == "body"


def test_api_catalogs_and_openapi():
    """The catalogs the page lists are the rows `trainplan models --json` and `gpus --json` print
    (the command adds each accelerator's published accuracy; Llama 3 70B: the 70,553,706,496
    parameters of Hugging Face's Meta-Llama-3-70B)."""
    import subprocess
    import sys

    models, gpus = client.get("/api/models").json(), client.get("/api/gpus").json()
    assert len(models) >= 20 and any(g["name"] == "H100-SXM" for g in gpus)
    assert next(m for m in models if m["name"] == "llama-3-70b")["params"] == 70_553_706_496
    for path, rows in (("models", models), ("gpus", gpus)):
        cli = subprocess.run([sys.executable, "-m", "trainplan", path, "--json"], capture_output=True, text=True,
                             check=True)
        assert [{k: row[k] for k in api} for row, api in zip(json.loads(cli.stdout), rows, strict=True)] == rows, path
    spec = client.get("/openapi.json").json()
    assert {"/api/plan", "/api/search", "/api/compare", "/api/export"} <= set(spec["paths"])
    assert client.get("/static/../app.py").status_code == 404


# ---- the page in Chromium --------------------------------------------------------------
def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    uvicorn = pytest.importorskip("uvicorn")
    port = _free_port()
    config = uvicorn.Config(create_app(), host="127.0.0.1", port=port, log_level="warning")
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    for _ in range(100):
        if srv.started:
            break
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    srv.should_exit = True
    thread.join(5)


@pytest.fixture(scope="module")
def browser():
    if not os.path.exists(CHROMIUM):
        pytest.skip("Debian's chromium is not installed (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync"])
        yield b
        b.close()


def _ready(page):
    page.wait_for_function("document.body.dataset.state === 'ready'")
    page.wait_for_load_state("networkidle")


def _api(body):
    return client.post("/api/plan", json=body).json()


def _open(browser, server, state: dict):
    """A page opened on a shared URL holding `state`, ready."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(server + "/?" + "&".join(f"{k}={v}" for k, v in state.items()))
    _ready(page)
    return page


def _form_in_chinese_says(page, *texts):
    """Switch the page to Chinese: the form then reads each of `texts`."""
    page.click("#lang")
    page.wait_for_function("document.documentElement.lang === 'zh-CN'")
    form = page.inner_text("form")
    assert all(text in form for text in texts), texts


def _tick_and_match_peak(page, base: dict, box: str) -> dict:
    """Tick a checkbox: the page shows the API's peak for the plan with it, which is lower."""
    with page.expect_response("**/api/plan"):
        page.check(f"input[name={box}]")
    ticked = _api({**base, box: True})
    assert ticked["memory"]["peak_bytes"] < _api(base)["memory"]["peak_bytes"]
    page.wait_for_function(f"Number(document.querySelector('#fit').dataset.peak) == {ticked['memory']['peak_bytes']}")
    return ticked


def test_page_choose_model_gpu_move_tp_and_zero(server, browser):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(server + "/")
    _ready(page)
    page.select_option("#model", "llama-3-70b")
    page.fill("input[name=gpus]", "64")
    page.select_option("#gpu", "A100-80GB-SXM")
    page.select_option("select[name=tp]", "8")
    with page.expect_response("**/api/plan"):
        page.select_option("select[name=zero]", "0")
    _ready(page)
    before = _api({"model": "llama-3-70b", "gpu": "A100-80GB-SXM", "gpus": 64, "tp": 8, "zero": 0})
    page.wait_for_function(f"Number(document.querySelector('#fit').dataset.peak) == {before['memory']['peak_bytes']}")
    assert page.get_attribute("#fit", "data-fits") == str(before["memory"]["fits"]).lower()
    # ZeRO-3 shards weights, gradients and optimizer state: the bar and the state follow the API
    with page.expect_response("**/api/plan"):
        page.select_option("select[name=zero]", "3")
    after = _api({"model": "llama-3-70b", "gpu": "A100-80GB-SXM", "gpus": 64, "tp": 8, "zero": 3})
    page.wait_for_function(f"Number(document.querySelector('#fit').dataset.peak) == {after['memory']['peak_bytes']}")
    assert after["memory"]["peak_bytes"] < before["memory"]["peak_bytes"]
    assert page.get_attribute("#fit", "data-fits") == str(after["memory"]["fits"]).lower()
    totals = [float(x) for x in page.eval_on_selector_all(".bar-row", "rows => rows.map(r => r.dataset.total)")]
    assert totals == pytest.approx([s["total_bytes"] for s in after["memory"]["stages"]])
    assert "?" in page.url and "zero=3" in page.url and "tp=8" in page.url
    page.close()


def test_page_offers_fsdp_only_its_sharding_strategies(server, browser):
    """FSDP has no ZeRO-1: with an FSDP framework the page disables that choice and, for a
    replicated plan, suggests its ZeRO-2 (SHARD_GRAD_OP), in both languages; DeepSpeed offers
    ZeRO-1 again. Left at the framework's default, FSDP shards fully."""
    assert _api({"model": "llama-3-8b", "gpus": 8, "framework": "fsdp"})["parallel"]["zero"] == 3
    page = _open(browser, server, {"model": "llama-3-8b", "gpus": 8, "zero": 0, "framework": "fsdp"})
    disabled = "s => [...s.options].filter(o => o.disabled).map(o => o.value)"
    assert page.eval_on_selector("select[name=zero]", disabled) == ["1"]
    assert "SHARD_GRAD_OP" in page.inner_text("#hints")
    page.click("#lang")
    page.wait_for_function("document.documentElement.lang === 'zh-CN'")
    assert "FSDP 降低静态显存" in page.inner_text("#hints")
    with page.expect_response("**/api/plan"):
        page.select_option("select[name=framework]", "deepspeed")
    _ready(page)
    assert page.eval_on_selector("select[name=zero]", disabled) == []
    assert "ZeRO-1" in page.inner_text("#hints")
    # hybrid sharding: ZeRO-3 over groups of 2 of the 8 ranks holds 4x the shards, to the API's peak
    with page.expect_response("**/api/plan"):
        page.select_option("select[name=zero]", "3")
    _ready(page)
    with page.expect_response("**/api/plan"):
        page.fill("input[name=dp_shard]", "2")
    hybrid = _api({"model": "llama-3-8b", "gpus": 8, "zero": 3, "framework": "deepspeed", "dp_shard": 2})
    assert hybrid["memory"]["peak_bytes"] > _api({"model": "llama-3-8b", "gpus": 8, "zero": 3})["memory"]["peak_bytes"]
    page.wait_for_function(f"Number(document.querySelector('#fit').dataset.peak) == {hybrid['memory']['peak_bytes']}")
    assert "dp_shard=2" in page.url and "分片组" in page.inner_text("form")
    page.close()


def test_page_chinese_shared_url_and_screenshots(server, browser, tmp_path):
    SHOTS = DOC_SHOTS if os.environ.get("TRAINPLAN_SCREENSHOTS") == "1" else tmp_path
    SHOTS.mkdir(parents=True, exist_ok=True)
    url = server + "/?model=llama-3-70b&gpu=H100-SXM&gpus=64&tp=8&pp=4&gbs=64&recompute=selective&sp=true"
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(url)
    _ready(page)
    # the shared URL restored every input
    assert page.input_value("#model") == "llama-3-70b"
    assert page.input_value("select[name=pp]") == "4"
    assert page.input_value("select[name=recompute]") == "selective"
    assert page.is_checked("input[name=sp]")
    want = _api({"model": "llama-3-70b", "gpu": "H100-SXM", "gpus": 64, "tp": 8, "pp": 4, "gbs": 64,
                 "recompute": "selective", "sp": True})
    page.wait_for_function(f"Number(document.querySelector('#fit').dataset.peak) == {want['memory']['peak_bytes']}")
    assert "Fits" in page.inner_text("#fit") or "Does not fit" in page.inner_text("#fit")
    page.screenshot(path=str(SHOTS / "explorer-en.png"), full_page=True)
    page.click("#lang")
    page.wait_for_function("document.documentElement.lang === 'zh-CN'")
    assert page.inner_text("h1") == "并行策略探索器"
    assert "装得下" in page.inner_text("#fit") or "装不下" in page.inner_text("#fit")
    assert "lang=zh" in page.url
    page.screenshot(path=str(SHOTS / "explorer-zh.png"), full_page=True)
    # reloading the shared URL (now with lang=zh) restores the language too
    page.goto(page.url)
    _ready(page)
    assert page.inner_text("h1") == "并行策略探索器"
    page.close()
    # a phone's first screen (390 x 844): the verdict and the peak stage's bar above the results
    for lang in ("en", "zh"):
        phone = browser.new_page(viewport={"width": 390, "height": 844}, device_scale_factor=2)
        phone.goto(server + "/" + ("?lang=zh" if lang == "zh" else ""))
        _ready(phone)
        phone.screenshot(path=str(SHOTS / f"explorer-phone-{lang}.png"))
        phone.close()
    for name in ("explorer-en", "explorer-zh", "explorer-phone-en", "explorer-phone-zh"):
        assert (SHOTS / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_page_tp_bound_hint_suggests_overlap_and_the_box_applies_it(server, browser):
    """TP 8 on H100 without overlap: TP collectives take a large share of the step and the hint
    says how to hide them; ticking the box sends overlap_tp, shrinks TP comm to the API's figure
    and goes into the shared URL."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(server + "/?model=llama-3-70b&gpu=H100-SXM&gpus=64&tp=8&pp=4&gbs=64&sp=true")
    _ready(page)
    assert "--tp-comm-overlap" in page.inner_text("#hints")
    base = {"model": "llama-3-70b", "gpu": "H100-SXM", "gpus": 64, "tp": 8, "pp": 4, "gbs": 64, "sp": True}
    with page.expect_response("**/api/plan"):
        page.check("input[name=overlap_tp]")
    _ready(page)
    want = _api({**base, "overlap_tp": True})["time"]
    assert want["breakdown_s"]["tp_comm"] < _api(base)["time"]["breakdown_s"]["tp_comm"]
    page.wait_for_function("!document.querySelector('#hints').innerText.includes('--tp-comm-overlap')")
    assert "overlap_tp=true" in page.url
    _form_in_chinese_says(page, "TP 通信与 GEMM 重叠")
    page.close()


def test_page_invalid_layout_shows_message_next_to_field(server, browser):
    """24 GPUs with TP 8: PP 2 is offered disabled (8 x 2 does not divide 24); forced anyway, the
    server's rule (gpus must be a multiple of tp x pp x cp) sits on PP, the field just changed,
    and the old results are withdrawn."""
    page = browser.new_page()
    page.goto(server + "/?model=llama-3-70b&gpus=8")
    _ready(page)
    page.fill("input[name=gpus]", "24")
    page.select_option("select[name=tp]", "8")
    page.wait_for_function("document.querySelector('select[name=pp] option[value=\"2\"]').disabled")
    page.eval_on_selector("select[name=pp]", "s => { s.value = '2'; s.dispatchEvent(new Event('change', {bubbles: true})); }")
    msg = page.wait_for_selector(".field-error[data-field=pp]")
    assert "must be a multiple of tp x pp x cp = 16 (got 24)" in msg.inner_text()
    assert page.eval_on_selector(".field-error", "e => e.parentElement.querySelector('select').name") == "pp"
    assert page.is_visible("#error") and page.is_hidden("#result-body") and page.is_visible("#withdrawn")
    assert page.get_attribute("#fit", "data-peak") is None
    page.close()


def test_page_debounces_typing_to_one_request(server, browser):
    """Two keystrokes 20 ms apart (under the page's 80 ms typing pause) ask once, for the typed
    number. The keystrokes are timed on the page's own clock: sent one by one from the test, a
    loaded machine can stretch the gap between them past the pause."""
    page = browser.new_page()
    page.goto(server + "/")
    _ready(page)
    requests = []
    page.on("request", lambda r: requests.append(r) if r.url.endswith("/api/plan") else None)
    page.evaluate("""async () => {
        const el = document.querySelector("input[name=gpus]");
        el.focus();
        for (const value of ["6", "64"]) {
            el.value = value;
            el.dispatchEvent(new InputEvent("input", {bubbles: true, data: value.at(-1)}));
            await new Promise(r => setTimeout(r, 20));
        }
    }""")
    page.wait_for_timeout(900)
    assert len(requests) == 1
    assert requests[0].post_data_json["gpus"] == 64
    page.close()


def test_api_search_bounded_and_validated():
    res = client.post("/api/search", json={"model": "llama-3-70b", "gpus": 64, "gbs": 128, "top": 3,
                                           "tp": 8, "fixed": ["tp"]})
    assert res.status_code == 200
    data = res.json()
    assert len(data["best"]) == 3 and all(b["parallel"]["tp"] == 8 for b in data["best"])
    assert data["evaluated"] <= 200_000
    for body, field in (({"top": 99}, "top"), ({"fixed": ["bogus"]}, "fixed"), ({"gpu_profile": "/x"}, "gpu_profile")):
        bad = client.post("/api/search", json={"model": "llama-3-70b", **body})
        assert bad.status_code == 422 and bad.json()["field"] == field


def test_page_find_best_layout_and_load_it(server, browser):
    page = browser.new_page(viewport={"width": 1400, "height": 1100})
    page.goto(server + "/?model=llama-3-70b&gpus=64&gbs=128")
    _ready(page)
    page.click("#find")
    page.wait_for_function("document.body.dataset.search === 'ready'")
    items = page.query_selector_all(".search-result")
    assert len(items) == 5
    api = client.post("/api/search", json={"model": "llama-3-70b", "gpu": "H100-SXM", "gpus": 64, "gbs": 128,
                                           "gpus_per_node": 8, "top": 5}).json()
    best = api["best"][0]["parallel"]
    with page.expect_response("**/api/plan"):
        items[0].click()
    _ready(page)
    assert page.input_value("select[name=tp]") == str(best["tp"])
    assert page.input_value("select[name=pp]") == str(best["pp"])
    # compared as numbers: a whole number of bytes prints as 123.0 in Python and 123 in JavaScript
    page.wait_for_function(f"Number(document.querySelector('#fit').dataset.peak) == {api['best'][0]['memory']['peak_bytes']}")
    page.close()
    # under hybrid sharding the layouts found keep the shard group and say so where it shards
    state = {"model": "llama-3-70b", "gpus": 128, "gbs": 256, "framework": "fsdp", "dp_shard": 16}
    page = _open(browser, server, state)
    page.click("#find")
    page.wait_for_function("document.body.dataset.search === 'ready'")
    rows = [e.inner_text() for e in page.query_selector_all(".search-result")]
    found = client.post("/api/search", json={**state, "top": 5}).json()["best"]
    hybrid = [b["parallel"]["zero"] >= 1 and b["parallel"]["dp_shard"] < b["parallel"]["dp"] for b in found]
    assert any(hybrid) and [("(sharded over 16)" in r) for r in rows] == hybrid
    page.close()


def test_page_kernel_choices_reach_the_plan(server, browser):
    """The Kernels fieldset: the fused cross-entropy lowers the peak to the API's figure (no fp32
    logits), the Triton attention kernel slows the step to the API's figure; an fp32 gradient
    reduction lengthens the data-parallel part, and an early-stopping full recompute shortens
    the step, each to the API's figure; all go into the shared URL, and the fields read in
    Chinese too."""
    base = {"model": "llama-3-8b", "gpu": "A100-80GB-SXM", "gpus": 8, "gbs": 8, "seq_len": 8192, "zero": 3}
    page = _open(browser, server, base)
    assert page.input_value("select[name=attention]") == "auto"  # the framework's own kernel by default
    fused = _tick_and_match_peak(page, base, "fused_loss")
    with page.expect_response("**/api/plan"):
        page.select_option("select[name=attention]", "triton")
    _ready(page)
    slow = _api({**base, "fused_loss": True, "attention": "triton"})
    assert slow["time"]["step_s"] > fused["time"]["step_s"]
    page.wait_for_function(f"Number(document.querySelector('#speed').dataset.step) == {slow['time']['step_s']}")
    assert "fused_loss=true" in page.url and "attention=triton" in page.url
    # bf16 gradients (DeepSpeed's conventions) reduced in fp32 instead: twice the scatter bytes
    with page.expect_response("**/api/plan"):
        page.select_option("select[name=reduce_dtype]", "fp32")
    _ready(page)
    wide = _api({**base, "fused_loss": True, "attention": "triton", "reduce_dtype": "fp32"})
    assert wide["time"]["breakdown_s"]["dp_comm"] > slow["time"]["breakdown_s"]["dp_comm"]
    page.wait_for_function(f"Number(document.querySelector('#speed').dataset.step) == {wide['time']['step_s']}")
    assert "reduce_dtype=fp32" in page.url
    # Megatron-LM's conventions: fp32 gradients and its own cross-entropy, to the API's figures
    with page.expect_response("**/api/plan"):
        page.select_option("select[name=framework]", "megatron")
    _ready(page)
    meg = _api({**base, "fused_loss": True, "attention": "triton", "reduce_dtype": "fp32", "framework": "megatron"})
    page.wait_for_function(f"Number(document.querySelector('#fit').dataset.peak) == {meg['memory']['peak_bytes']}")
    assert "framework=megatron" in page.url
    with page.expect_response("**/api/plan"):
        page.select_option("select[name=framework]", "deepspeed")
    _ready(page)
    # full recompute, then a non-reentrant checkpoint that stops before each down projection
    with page.expect_response("**/api/plan"):
        page.select_option("select[name=recompute]", "full")
    _ready(page)
    with page.expect_response("**/api/plan"):
        page.check("input[name=recompute_early_stop]")
    _ready(page)
    recomputed = {**base, "fused_loss": True, "attention": "triton", "reduce_dtype": "fp32", "recompute": "full"}
    early = _api({**recomputed, "recompute_early_stop": True})
    assert early["time"]["step_s"] < _api(recomputed)["time"]["step_s"]
    page.wait_for_function(f"Number(document.querySelector('#speed').dataset.step) == {early['time']['step_s']}")
    assert "recompute_early_stop=true" in page.url
    # DeepSpeed's fused Adam, then torch.optim's for-loop step: 80/28 of its traffic (the
    # gradient clipping beside it, the same passes either way)
    with page.expect_response("**/api/plan"):
        page.select_option("select[name=optimizer_impl]", "for-loop")
    _ready(page)
    looped = _api({**recomputed, "recompute_early_stop": True, "optimizer_impl": "for-loop"})
    unclipped = [_api({**recomputed, "recompute_early_stop": True, "grad_clip": 0, **impl})["time"]["breakdown_s"]
                 ["optimizer"] for impl in ({}, {"optimizer_impl": "for-loop"})]
    assert unclipped[1] == pytest.approx(unclipped[0] * 2.857, rel=1e-9)
    assert looped["time"]["breakdown_s"]["optimizer"] - early["time"]["breakdown_s"]["optimizer"] == pytest.approx(
        unclipped[1] - unclipped[0], rel=1e-9)
    page.wait_for_function(f"Number(document.querySelector('#speed').dataset.step) == {looped['time']['step_s']}")
    assert "optimizer_impl=for-loop" in page.url
    page.click("#lang")
    page.wait_for_function("document.documentElement.lang === 'zh-CN'")
    form_text = page.inner_text("form")
    assert all(word in form_text for word in ("融合交叉熵", "算子实现", "梯度归约精度", "非重入式", "优化器实现"))
    page.close()


def test_page_shows_the_plans_warnings_in_both_languages(server, browser):
    """The plan's warnings reach the page among the hints, worded in its language: here
    sequence parallelism without TP, and an early-stopping recompute with nothing recomputed.
    The API carries each as a code with its parameters beside the English message."""
    details = _api({"model": "llama-3-8b", "gpus": 8, "sp": True, "recompute_early_stop": True})["warning_details"]
    assert [d["code"] for d in details] == ["sp_needs_tp", "early_stop_unused"]
    assert details[1]["params"] == {"recompute": "none"} and "full recomputation" in details[1]["message"]
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(server + "/?model=llama-3-8b&gpus=8&sp=true&recompute_early_stop=true")
    _ready(page)
    hints = page.inner_text("#hints")
    assert "Sequence parallelism needs TP > 1" in hints and "changes only full recompute (recompute is none)" in hints
    page.click("#lang")
    page.wait_for_function("document.documentElement.lang === 'zh-CN'")
    page.wait_for_function("document.querySelector('#hints').innerText.includes('序列并行需要 TP > 1')")
    assert "当前重计算方式：不重计算" in page.inner_text("#hints")
    page.close()


def test_page_fused_kernels_lower_the_peak(server, browser):
    """The fused norm/SwiGLU box: the activations shrink (only the kernels' inputs are saved)
    and the page shows the API's peak; the choice goes into the shared URL."""
    base = {"model": "llama-3-8b", "gpu": "H100-SXM", "gpus": 8, "gbs": 8, "seq_len": 8192}
    page = _open(browser, server, base)
    _tick_and_match_peak(page, base, "fused_kernels")
    assert "fused_kernels=true" in page.url
    page.close()


def test_page_says_how_far_to_trust_the_step(server, browser):
    """Under the speed figures the page reports the published comparison behind them, as the API
    carries it: on H200 the H100 runs whose defaults it shares, with their mean and worst error;
    on B200 that no published run is compared yet; in both languages."""
    a = _api({"model": "llama-3-8b", "gpu": "H200-SXM", "gpus": 8})["time"]["accuracy"]
    assert a["compared_on"] == "H100-SXM" and a["runs"] == 94
    page = _open(browser, server, {"model": "llama-3-8b", "gpu": "H200-SXM", "gpus": 8})
    text = page.inner_text("#accuracy")
    assert "94 published runs (9 fitted on) on H100-SXM, whose efficiency defaults H200-SXM shares" in text
    assert f"{100 * a['mean_abs_error']:.1f}% mean error, {100 * a['worst_abs_error']:.1f}% worst" in text
    page.click("#lang")
    page.wait_for_function("document.querySelector('#accuracy').innerText.startsWith('准确度')")
    assert f"平均误差 {100 * a['mean_abs_error']:.1f}%" in page.inner_text("#accuracy")
    page.close()
    page = _open(browser, server, {"model": "llama-3-8b", "gpu": "B200", "gpus": 8})
    assert "no published run on B200 compared yet" in page.inner_text("#accuracy")
    page.close()
    # a mixture of experts on A100 is beyond the published (dense) runs there, and the page says so;
    # on H100 it names the published mixture of experts
    page = _open(browser, server, {"model": "mixtral-8x7b", "gpu": "A100-80GB-SXM", "gpus": 64, "ep": 8, "zero": 1})
    assert "not mixture of experts" in page.inner_text("#accuracy")
    page.click("#lang")
    page.wait_for_function("document.querySelector('#accuracy').innerText.includes('混合专家')")
    page.close()
    page = _open(browser, server, {"model": "mixtral-8x7b", "gpu": "H100-SXM", "gpus": 64, "ep": 8, "zero": 1})
    assert "Of them, mixtures of experts: 1." in page.inner_text("#accuracy")
    page.close()


def test_page_gradient_clipping_dropout_and_precision_reach_the_plan(server, browser):
    """Turning gradient clipping off (norm 0) drops its passes over the gradients from the
    optimizer step, dropout adds its masks to the activations, pure 16-bit training and the
    optimizer state's dtype change the bytes per parameter: the page shows the API's step and
    peak for each and keeps them in the shared URL."""
    base = {"model": "llama-3-8b", "gpus": 8, "zero": 1}
    page = _open(browser, server, base)
    with page.expect_response("**/api/plan"):
        page.fill("input[name=grad_clip]", "0")
    unclipped = _api({**base, "grad_clip": 0})
    assert unclipped["time"]["breakdown_s"]["optimizer"] < _api(base)["time"]["breakdown_s"]["optimizer"]
    page.wait_for_function(f"Number(document.querySelector('#speed').dataset.step) == {unclipped['time']['step_s']}")
    with page.expect_response("**/api/plan"):
        page.fill("input[name=dropout]", "0.1")
    dropped = _api({**base, "grad_clip": 0, "dropout": 0.1})
    assert dropped["memory"]["peak_bytes"] > unclipped["memory"]["peak_bytes"]
    page.wait_for_function(f"Number(document.querySelector('#fit').dataset.peak) == {dropped['memory']['peak_bytes']}")
    assert "grad_clip=0" in page.url and "dropout=0.1" in page.url
    # pure 16-bit training, then fp32 moments beside the bf16 weights: 8, then 12 bytes per parameter
    with page.expect_response("**/api/plan"):
        page.check("input[name=no_master_weights]")
    pure = {**base, "grad_clip": 0, "dropout": 0.1, "master_weights": False}
    page.wait_for_function(f"Number(document.querySelector('#fit').dataset.peak) == {_api(pure)['memory']['peak_bytes']}")
    with page.expect_response("**/api/plan"):
        page.select_option("select[name=optimizer_state_dtype]", "fp32")
    fp32_state = _api({**pure, "optimizer_state_dtype": "fp32"})
    assert fp32_state["recipe"]["optimizer_state_bytes"] == 4 and _api(pure)["recipe"]["optimizer_state_bytes"] == 2
    page.wait_for_function(f"Number(document.querySelector('#fit').dataset.peak) == {fp32_state['memory']['peak_bytes']}")
    assert "no_master_weights=true" in page.url and "optimizer_state_dtype=fp32" in page.url
    page.close()


def test_page_recomputes_the_chosen_layers_only_under_full_recompute(server, browser):
    """The layers-recomputed field is open only under full recomputation. Recomputing 8 of
    Llama 3 8B's 32 layers keeps the other 24 layers' activations (a higher peak than all 32
    recomputed) and re-runs a quarter of the forward (a shorter step): the page shows the API's
    peak and step, keeps the field in the shared URL and says it in Chinese."""
    base = {"model": "llama-3-8b", "gpus": 8, "zero": 1}
    page = _open(browser, server, base)
    assert page.is_disabled("input[name=recompute_layers]")
    with page.expect_response("**/api/plan"):
        page.select_option("select[name=recompute]", "full")
    _ready(page)
    assert page.is_enabled("input[name=recompute_layers]")
    with page.expect_response("**/api/plan"):
        page.fill("input[name=recompute_layers]", "8")
    every, some = _api({**base, "recompute": "full"}), _api({**base, "recompute": "full", "recompute_layers": 8})
    assert some["memory"]["peak_bytes"] > every["memory"]["peak_bytes"]
    assert some["time"]["step_s"] < every["time"]["step_s"]
    page.wait_for_function(f"Number(document.querySelector('#fit').dataset.peak) == {some['memory']['peak_bytes']}")
    page.wait_for_function(f"Number(document.querySelector('#speed').dataset.step) == {some['time']['step_s']}")
    assert "recompute_layers=8" in page.url
    _form_in_chinese_says(page, "每个流水线阶段重计算的层数")
    # back to selective: the field closes and leaves the request
    with page.expect_response("**/api/plan"):
        page.select_option("select[name=recompute]", "selective")
    _ready(page)
    assert page.is_disabled("input[name=recompute_layers]") and "recompute_layers" not in page.url
    page.close()


def test_page_offloads_the_optimizer_to_the_host(server, browser):
    """Ticking the optimizer's offload moves its state off the GPU (a lower peak) and its step to
    the host (a longer step), to the API's figures; the box reads in Chinese too."""
    base = {"model": "llama-3-8b", "gpus": 8, "zero": 2}
    page = _open(browser, server, base)
    ticked = _tick_and_match_peak(page, base, "offload_optimizer")
    assert ticked["time"]["step_s"] > _api(base)["time"]["step_s"]
    page.wait_for_function(f"Number(document.querySelector('#speed').dataset.step) == {ticked['time']['step_s']}")
    assert "offload_optimizer=true" in page.url
    _form_in_chinese_says(page, "优化器放到主机内存")
    page.close()


def test_page_plans_lora_and_qlora_fine_tuning(server, browser):
    """The fine-tuning fields: LoRA freezes the base (a far lower peak than full training) and its
    adapters' dropout keeps their dropped inputs (a higher one); QLoRA's 4-bit base lower still.
    The adapters' fields open only for LoRA and QLoRA, the base's bits only for QLoRA; each
    figure is the API's, and the fields read in Chinese."""
    base = {"model": "llama-3-8b", "gpus": 1}
    page = _open(browser, server, base)
    assert page.is_disabled("input[name=lora_rank]") and page.is_disabled("select[name=qlora_bits]")
    with page.expect_response("**/api/plan"):
        page.select_option("select[name=finetune]", "lora")
    _ready(page)
    lora = _api({**base, "finetune": "lora"})
    assert lora["memory"]["peak_bytes"] < _api(base)["memory"]["peak_bytes"]
    page.wait_for_function(f"Number(document.querySelector('#fit').dataset.peak) == {lora['memory']['peak_bytes']}")
    assert page.is_enabled("input[name=lora_dropout]") and page.is_disabled("select[name=qlora_bits]")
    with page.expect_response("**/api/plan"):
        page.fill("input[name=lora_dropout]", "0.1")
    dropped = _api({**base, "finetune": "lora", "lora_dropout": 0.1})
    assert dropped["memory"]["peak_bytes"] > lora["memory"]["peak_bytes"]
    page.wait_for_function(f"Number(document.querySelector('#fit').dataset.peak) == {dropped['memory']['peak_bytes']}")
    with page.expect_response("**/api/plan"):
        page.select_option("select[name=finetune]", "qlora")
    _ready(page)
    qlora = _api({**base, "finetune": "qlora", "lora_dropout": 0.1, "qlora_bits": 4})
    assert qlora["memory"]["peak_bytes"] < dropped["memory"]["peak_bytes"]
    page.wait_for_function(f"Number(document.querySelector('#fit').dataset.peak) == {qlora['memory']['peak_bytes']}")
    assert "finetune=qlora" in page.url and "lora_dropout=0.1" in page.url
    _form_in_chinese_says(page, "适配器 dropout", "微调")
    page.close()


def test_api_compare_ranks_accelerators_and_refuses_by_name():
    """POST /api/compare: the same plan's best layout on each accelerator (as `search
    --compare-gpus`), each row that accelerator's own search's best; bad input is a 422 naming
    the field."""
    body = {"model": "llama-3-8b", "gpus": 8, "gbs": 64}
    res = client.post("/api/compare", json={**body, "compare_gpus": ["H100-SXM", "A100-80GB-SXM", "MI300X"]})
    assert res.status_code == 200
    rows = res.json()["rows"]
    assert {r["gpu"] for r in rows} == {"H100-SXM", "A100-80GB-SXM", "MI300X"}
    speeds = [r["best"]["time"]["tokens_per_s"] for r in rows]
    assert speeds == sorted(speeds, reverse=True)
    for r in rows:
        alone = client.post("/api/search", json={**body, "gpu": r["gpu"], "top": 1}).json()["best"][0]
        assert r["best"]["time"]["step_s"] == alone["time"]["step_s"]
    everything = client.post("/api/compare", json=body).json()["rows"]  # default: the whole catalog
    assert len(everything) == len(client.get("/api/gpus").json())
    for bad, field in (({"gpu": "H100-SXM"}, "compare_gpus"), ({"compare_gpus": ["H100-SXM", "nope"]}, "compare_gpus"),
                       ({"compare_gpus": 7}, "compare_gpus"), ({"fixed": ["bogus"]}, "fixed"),
                       ({"nic_gbps": -1}, "nic_gbps")):
        out = client.post("/api/compare", json={**body, **bad})
        assert out.status_code == 422 and out.json()["field"] == field, (bad, out.json())


def test_page_compares_accelerators_and_loads_one(server, browser):
    """The explorer's comparison lists the API's rows in its order, in both languages, says why
    an accelerator could not be planned, and a click loads that accelerator and its layout."""
    state = {"model": "llama-3-8b", "gpus": 16, "gbs": 64}
    page = _open(browser, server, state)
    page.click("#compare")
    page.wait_for_function("document.body.dataset.compare === 'ready'")
    api = client.post("/api/compare", json={**state, "compare_gpus": "all"}).json()["rows"]
    shown = [e.get_attribute("data-gpu") for e in page.query_selector_all(".compare-row")]
    assert shown == [r["gpu"] for r in api if r["best"]]
    skipped = page.inner_text("#compare-skipped")
    # 16 GPUs span two nodes; the catalog lists no network for it: the field is named by its label
    assert "RTX-4090: network between nodes, Gb/s per GPU: 16 GPUs span 2 nodes" in skipped
    assert "time error" in page.inner_text("#compare-results")
    assert "on 16 GPUs, global batch 64 x 4,096" in page.inner_text("#compare-status")
    page.click("#lang")
    page.wait_for_function("document.documentElement.lang === 'zh-CN'")
    assert "时间误差" in page.inner_text("#compare-results") and "比较加速卡" in page.inner_text("#results")
    assert "16 块 GPU、全局批 64 × 4,096" in page.inner_text("#compare-status")
    assert "RTX-4090：节点间网络带宽（每块 GPU，Gb/s）——16 块 GPU 跨 2 个节点" in page.inner_text("#compare-skipped")
    # ranked by the training's cost instead: the API's order, priced accelerators cheapest first
    with page.expect_response("**/api/compare"):
        page.select_option("#compare-objective", "cost")
    page.wait_for_function("document.querySelector('#compare-status').innerText.includes('训练总费用')")
    by_cost = client.post("/api/compare", json={**state, "compare_gpus": "all", "objective": "cost"}).json()["rows"]
    assert [e.get_attribute("data-gpu") for e in page.query_selector_all(".compare-row")] == \
        [r["gpu"] for r in by_cost if r["best"]]
    costs = [r["best"]["training"]["cost_usd"] for r in by_cost if r["best"] and r["best"]["training"]["cost_usd"]]
    assert costs == sorted(costs)
    shown = [e.get_attribute("data-gpu") for e in page.query_selector_all(".compare-row")]
    api = by_cost
    second = next(r for r in api if r["best"] and r["gpu"] == shown[1])
    with page.expect_response("**/api/plan"):
        page.query_selector_all(".compare-row")[1].click()
    _ready(page)
    assert page.input_value("#gpu") == second["gpu"]
    page.wait_for_function(
        f"Number(document.querySelector('#fit').dataset.peak) == {second['best']['memory']['peak_bytes']}")
    page.close()


def test_page_takes_the_clusters_own_links(server, browser):
    """The link fields show the accelerator's catalog links until the plan gives its own; a
    thinner network slows the data-parallel step as the API says."""
    state = {"model": "llama-3-8b", "gpus": 16, "zero": 3, "gbs": 64}
    page = _open(browser, server, state)
    assert page.get_attribute("input[name=nic_gbps]", "placeholder") == "400"
    assert page.get_attribute("input[name=scale_up_gbs]", "placeholder") == "900"
    with page.expect_response("**/api/plan"):
        page.fill("input[name=nic_gbps]", "100")
    thin = _api({**state, "nic_gbps": 100})
    assert thin["gpu"]["nic_gbps"] == 100
    assert thin["time"]["step_s"] > _api(state)["time"]["step_s"]
    page.wait_for_function(f"Number(document.querySelector('#speed').dataset.step) == {thin['time']['step_s']}")
    assert page.get_attribute("input[name=gpus_per_node]", "placeholder") == "8"
    page.select_option("#gpu", "MI300X")
    assert page.get_attribute("input[name=nic_gbps]", "placeholder") == "400"
    assert page.get_attribute("input[name=scale_up_gbs]", "placeholder") == "896"
    page.select_option("#gpu", "GB200")  # an NVL72 rack: 72 GPUs on one NVLink domain
    assert page.get_attribute("input[name=gpus_per_node]", "placeholder") == "72"
    page.close()
