"""The explorer page as a new user meets it, in Chromium (Playwright, Debian's /usr/bin/chromium,
headless): honest state on bad input, the resolved plan, a first screen that fits, complete
Chinese, phones, shared URLs, the whole run, the pictures, the formulas and the loading state.
Each test runs in English and Simplified Chinese, on a desktop and on a 390 x 844 phone."""

import re

import pytest

pytest.importorskip("fastapi")
import test_web  # noqa: E402
from test_web import _api, client  # noqa: E402

server, browser = test_web.server, test_web.browser  # the page's server and Chromium, as test_web starts them

GiB = 2**30
VIEWS = {"desktop": {"width": 1400, "height": 1000}, "phone": {"width": 390, "height": 844}}
BOTH = [("en", "desktop"), ("zh", "phone"), ("zh", "desktop"), ("en", "phone")]
README = {"model": "llama-3-70b", "gpu": "H100-SXM", "gpus": 64, "tp": 8, "pp": 4, "gbs": 64, "recompute": "selective",
          "sp": "true"}
CJK = r"[\u3000-\u303f\u4e00-\u9fff\uff00-\uffef]"


def _open(browser, server, lang, view, state=None, raw=None, wait=True):
    page = browser.new_page(viewport=VIEWS[view])
    query = raw if raw is not None else "&".join(f"{k}={v}" for k, v in (state or {}).items())
    page.goto(server + "/?" + query + ("&lang=zh" if lang == "zh" else ""))
    if wait:
        page.wait_for_function("['ready', 'error'].includes(document.body.dataset.state)")
        page.wait_for_load_state("networkidle")
    return page


def _gib(x):
    return f"{x / GiB:,.2f} GiB"


def _peak_is(page, peak):
    page.wait_for_function(f"Number(document.querySelector('#fit').dataset.peak) == {peak}")


def _force(page, name, value):
    """Set a drop-down to a value it offers disabled (as a shared URL or a stale form might)."""
    page.eval_on_selector(f"select[name={name}]", f"s => {{ s.value = '{value}'; "
                          "s.dispatchEvent(new Event('input', {bubbles: true})); "
                          "s.dispatchEvent(new Event('change', {bubbles: true})); }")


def _in_view(page, selector):
    box = page.eval_on_selector(selector, "e => { const r = e.getBoundingClientRect(); return [r.top, r.bottom, r.height]; }")
    height = page.viewport_size["height"]
    return box[2] > 0 and box[0] >= 0 and box[1] <= height


def _untranslated(page, link: str = "") -> list[str]:
    """Latin-script words on the Chinese page that are neither kept names (KEPT_TERMS), catalog
    names nor numbers, and ASCII punctuation beside Chinese text."""
    text = page.evaluate("""() => [document.body.innerText,
        ...[...document.querySelectorAll('option')].map(o => o.textContent),
        ...[...document.querySelectorAll('input[placeholder], textarea')].filter(e => e.name !== 'hf_config')
           .map(e => e.placeholder)].join('\\n')""")
    kept = set(page.evaluate("KEPT_TERMS"))
    names = {m["name"] for m in client.get("/api/models").json()} | {g["name"] for g in client.get("/api/gpus").json()}
    typed = set(re.findall(r"[^&=?]+", link + "&" + page.url.split("?", 1)[-1]))  # what the user gave
    text = re.sub(r"--[a-z][a-z-]*", " ", text)  # command-line flags, as the CLI spells them
    words = re.findall(r"(?<![A-Za-z0-9])[A-Za-z0-9]*[A-Za-z][A-Za-z0-9]*(?:[-_.'][A-Za-z0-9]+)*", text)
    ok = lambda w: w in kept or w in names or w in typed or re.fullmatch(r"v\d+", w) or (  # noqa: E731
        re.fullmatch(r"(.+)-\d+", w) and re.fullmatch(r"(.+)-\d+", w).group(1) in kept)
    bad = [w for w in words if not ok(w)]
    bad += re.findall(rf"{CJK}[:;,()!?]|[:;,(!?]{CJK}", text)
    return bad


# 1. honest state --------------------------------------------------------------------------
@pytest.mark.parametrize("lang,view", BOTH)
def test_invalid_inputs_withdraw_the_results_and_blame_the_field_changed(server, browser, lang, view):
    """On the README's layout the drop-downs offer only what 64 GPUs and Llama 3 70B allow (PP
    128 and any EP on a dense model are listed disabled and marked); forced to PP 128 the plan
    cannot be made: the old verdict, bars, speed and cost go, and the rule sits on PP."""
    page = _open(browser, server, lang, view, README)
    want = _api({**README, "sp": True})
    _peak_is(page, want["memory"]["peak_bytes"])
    disabled = "s => [...s.options].filter(o => o.disabled).map(o => o.value)"
    assert page.eval_on_selector("select[name=pp]", disabled) == ["16", "32", "64", "128"]  # 8 x pp must divide 64
    assert page.eval_on_selector("select[name=ep]", disabled) == ["2", "4", "8", "16", "32", "64", "128"]
    assert "✗" in page.eval_on_selector("select[name=pp] option[value='128']", "o => o.textContent")
    assert client.post("/api/plan", json={**README, "sp": True, "pp": 128}).json()["field"] == "gpus"
    _force(page, "pp", "128")
    msg = page.wait_for_selector(".field-error[data-field=pp]")
    assert (("必须是 tp × pp × cp = 1024 的倍数（当前为 64）" if lang == "zh" else
             "must be a multiple of tp x pp x cp = 1024 (got 64)") in msg.inner_text())
    assert page.get_attribute("#fit", "data-peak") is None and page.is_hidden("#result-body")
    assert page.is_visible("#withdrawn") and page.inner_text("#summary-speed") == ""
    assert ("无法规划" if lang == "zh" else "Cannot plan this") in page.inner_text("#fit")
    assert not page.query_selector_all("#summary-bar .seg")
    # back to PP 4: the plan returns, to the API's peak
    page.select_option("select[name=pp]", "4")
    _peak_is(page, want["memory"]["peak_bytes"])
    assert page.is_visible("#result-body") and page.is_hidden("#withdrawn") and not page.query_selector(".field-error")
    # a mixture of experts: EP up to its 8 experts (and the data-parallel ranks), not beyond
    page.select_option("#model", "mixtral-8x7b")
    page.select_option("select[name=tp]", "1")
    page.wait_for_function("!document.querySelector('select[name=ep] option[value=\"8\"]').disabled")
    assert page.eval_on_selector("select[name=ep]", disabled) == ["16", "32", "64", "128"]
    page.close()


# 2. everything decided is shown ---------------------------------------------------------------
@pytest.mark.parametrize("lang,view", BOTH)
def test_the_resolved_layout_line_shows_what_the_plan_decided(server, browser, lang, view):
    """DP, the ZeRO stage, SP, the sequence length, the global batch and the micro-batches per
    step, as the plan resolved them (the CLI's layout line)."""
    page = _open(browser, server, lang, view, README)
    p = _api({**README, "sp": True})["parallel"]
    page.wait_for_selector("#resolved[data-layout]")
    shown = page.evaluate("JSON.parse(document.querySelector('#resolved').dataset.layout)")
    assert shown == {k: p[k] for k in ("tp", "pp", "dp", "cp", "ep", "zero", "sp", "mbs", "seq_len", "gbs", "micro_batches")}
    text = page.inner_text("#resolved")
    assert "TP 8 · PP 4 · DP 2 · CP 1 · EP 1 · ZeRO-0 · SP " + ("开" if lang == "zh" else "on") in text
    assert p["micro_batches"] == 32 and p["seq_len"] == 4096
    assert ("微批 1 × 序列 4,096，全局批 64（每步 32 个微批）" if lang == "zh" else
            "micro-batch 1 × sequence 4,096, global batch 64 (32 micro-batches per step)") in text
    assert ("重计算：选择性" if lang == "zh" else "recompute selective") in text
    # the inputs left to the plan show what it chose
    placeholders = {n: page.get_attribute(f"input[name={n}]", "placeholder") for n in ("dp", "seq_len", "dp_shard")}
    auto = "自动（{}）" if lang == "zh" else "auto ({})"
    assert placeholders == {"dp": auto.format(2), "seq_len": auto.format("4,096"), "dp_shard": auto.format(2)}
    assert page.eval_on_selector("select[name=zero] option[value='']", "o => o.textContent").endswith("→ 0")
    page.close()


# 3. the first screen ------------------------------------------------------------------------
@pytest.mark.parametrize("lang,view", BOTH)
def test_the_first_screen_is_a_plan_that_fits_and_none_is_said(server, browser, lang, view):
    """A bare URL opens on Llama 3 8B on 8 H100 with ZeRO-2: it fits (65.60 of 80 GiB, as
    `trainplan plan --zero 2` prints); with the framework's ZeRO-0 nothing fits and the largest
    micro-batch reads "none", as the CLI says."""
    page = _open(browser, server, lang, view, raw="")  # the bare URL (in Chinese: ?lang=zh only)
    starter = _api({"model": "llama-3-8b", "gpu": "H100-SXM", "gpus": 8, "zero": 2})
    assert starter["memory"]["fits"] and f"{starter['memory']['peak_bytes'] / GiB:.2f}" == "65.60"
    _peak_is(page, starter["memory"]["peak_bytes"])
    assert page.get_attribute("#fit", "data-fits") == "true" and "65.60" in page.inner_text("#fit")
    assert "zero=2" in page.url
    # one pipeline stage: the schedules that need several are offered disabled, and no virtual stages
    assert page.eval_on_selector("select[name=schedule]", "s => [...s.options].filter(o => o.disabled).map(o => o.value)") \
        == ["interleaved", "zb", "dualpipe", "looped_bfs", "zbv", "dualpipev"]
    assert page.is_disabled("input[name=vpp]")
    page.select_option("select[name=zero]", "0")
    zero0 = _api({"model": "llama-3-8b", "gpu": "H100-SXM", "gpus": 8, "zero": 0})
    assert zero0["memory"]["max_mbs"] == 0
    _peak_is(page, zero0["memory"]["peak_bytes"])
    assert ("能装下的最大微批：无（1 也装不下）" if lang == "zh" else
            "largest micro-batch that fits: none (even 1 does not fit)") in page.inner_text("#speed")
    page.close()


# 4. complete Chinese ------------------------------------------------------------------------
@pytest.mark.parametrize("view", ["desktop", "phone"])
def test_the_chinese_page_has_no_untranslated_string(server, browser, view):
    """Every visible string of the Chinese page, its options, a validation error, search rows and
    the URL's warnings: Chinese or a kept name; full-width punctuation; 万/亿 for large numbers."""
    page = _open(browser, server, "zh", view, {**README, "tokens": "2e12"})
    want = _api({**{k: v for k, v in README.items() if k != "sp"}, "sp": True, "tokens": 2e12})
    _peak_is(page, want["memory"]["peak_bytes"])
    assert not (bad := _untranslated(page)), " | ".join(bad)
    assert "2 万亿" not in page.inner_text("#run") and "20,000 亿" in page.inner_text("#run")
    tps = want["time"]["tokens_per_s"]
    assert f"{tps / 1e4:,.2f} 万" in page.inner_text("#speed") or f"{tps / 1e4:,.1f} 万" in page.inner_text("#speed")
    assert "B" not in page.inner_text("#run").replace("GiB", "")
    page.click("#find")
    page.wait_for_function("document.body.dataset.search === 'ready'")
    assert not (bad := _untranslated(page)), " | ".join(bad)
    _force(page, "pp", "128")
    page.wait_for_selector(".field-error[data-field=pp]")
    assert not (bad := _untranslated(page)), " | ".join(bad)
    page.close()
    # a typo and an alias in a shared link, and a dense model's EP: the warnings and the error in Chinese
    link = "model=llama3-70b&gpu=h100&foo=1"
    page = _open(browser, server, "zh", view, raw=link)
    page.wait_for_selector(".field-error[data-field=model]")
    assert "未知的模型“llama3-70b”（是否想用 llama-3-70b" in page.inner_text("form")
    assert not (bad := _untranslated(page, link)), " | ".join(bad)
    page.close()


# 5. phones and long pages -----------------------------------------------------------------------
@pytest.mark.parametrize("lang,view", BOTH)
def test_the_verdict_and_memory_bar_stay_in_view_without_sideways_scrolling(server, browser, lang, view):
    """At 390 px nothing scrolls sideways and the verdict and the memory bar show together on
    the first screen; scrolled to the last input (desktop and phone alike) they are still in view;
    each memory component's value is written out, not left to a tooltip."""
    page = _open(browser, server, lang, view, README)
    want = _api({**README, "sp": True})
    _peak_is(page, want["memory"]["peak_bytes"])
    width = VIEWS[view]["width"]
    assert page.evaluate("document.scrollingElement.scrollWidth") <= width
    assert _in_view(page, "#fit") and _in_view(page, "#summary-bar")
    if view == "phone":  # the results come first; one tap reaches the inputs, the verdict still in view
        page.click("#to-inputs")
        page.wait_for_function("document.querySelector('#controls').getBoundingClientRect().top < 300")
        assert _in_view(page, "#fit") and _in_view(page, "#summary-bar")
    else:
        assert page.is_hidden("#to-inputs")
    page.eval_on_selector("input[name=grid_kg_per_kwh]", "e => e.scrollIntoView()")
    page.wait_for_timeout(100)
    assert _in_view(page, "#fit") and _in_view(page, "#summary-bar")
    page.evaluate("window.scrollTo(0, document.scrollingElement.scrollHeight)")
    page.wait_for_timeout(100)
    assert _in_view(page, "#fit") and _in_view(page, "#summary-bar")
    stage = next(s for s in want["memory"]["stages"] if s["stage"] == want["memory"]["peak_stage"])
    legend = page.inner_text("#legend")
    for value in (stage["params_bytes"], stage["grads_bytes"], stage["other_bytes"]):
        assert _gib(value) in legend
    page.close()


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_a_comparison_keeps_the_phone_page_narrow(server, browser, lang):
    page = _open(browser, server, lang, "phone", {"model": "llama-3-8b", "gpus": 16, "gbs": 64})
    page.click("#compare")
    page.wait_for_function("document.body.dataset.compare === 'ready'", timeout=60_000)
    assert page.evaluate("document.scrollingElement.scrollWidth") <= 390
    if lang == "zh":
        assert not (bad := _untranslated(page)), " | ".join(bad)
    page.close()


# 6. URLs ------------------------------------------------------------------------------------
@pytest.mark.parametrize("lang,view", BOTH)
def test_shared_urls_round_trip_and_say_what_they_could_not_read(server, browser, lang, view):
    state = {**README, "recompute": "full", "recompute_layers": 4, "schedule": "interleaved", "vpp": 2,
             "tokens": "1e12", "price": "2.5", "pue": "1.3", "grid_kg_per_kwh": "0.4", "dropout": "0.1"}
    page = _open(browser, server, lang, view, state)
    page.wait_for_function("document.body.dataset.state === 'ready'")
    form = "() => Object.fromEntries([...document.querySelectorAll('#controls [name]')].map(e => [e.name, " \
           "e.type === 'checkbox' ? e.checked : e.value]))"
    before, url = page.evaluate(form), page.url
    assert all(str(before[k]) == str(v) for k, v in state.items() if k != "sp") and before["sp"] is True
    again = browser.new_page(viewport=VIEWS[view])
    again.goto(url)
    again.wait_for_function("document.body.dataset.state === 'ready'")
    assert again.evaluate(form) == before and again.inner_text("h1") == page.inner_text("h1")
    assert again.get_attribute("#fit", "data-peak") == page.get_attribute("#fit", "data-peak")
    again.close()
    page.close()
    # a typo: kept and refused by name, with the catalog's suggestion; the results withdrawn
    page = _open(browser, server, lang, view, raw="model=llama3-70b&gpus=8")
    page.wait_for_selector(".field-error[data-field=model]")
    assert "model=llama3-70b" in page.inner_text("#url-warnings")
    assert ("是否想用 llama-3-70b" if lang == "zh" else "did you mean llama-3-70b") in page.inner_text("form")
    assert page.is_hidden("#result-body")
    page.close()
    # the CLI's alias, an unknown parameter and TP 3 (which no option offers)
    page = _open(browser, server, lang, view, raw="gpu=h100&gpus=8&zero=2&foo=1&mbs=x")
    assert page.input_value("#gpu") == "H100-SXM"
    notes = page.inner_text("#url-warnings")
    assert "gpu=h100" in notes and "H100-SXM" in notes and "foo=1" in notes and "mbs=x" in notes
    _peak_is(page, _api({"model": "llama-3-8b", "gpu": "H100-SXM", "gpus": 8, "zero": 2})["memory"]["peak_bytes"])
    page.close()
    page = _open(browser, server, lang, view, raw="tp=3&gpus=8")
    assert page.input_value("select[name=tp]") == "3" and "tp=3" in page.inner_text("#url-warnings")
    msg = page.wait_for_selector(".field-error[data-field=tp]")
    assert ("tp × pp × cp = 3" if lang == "zh" else "tp x pp x cp = 3") in msg.inner_text()
    page.close()


# 7. the whole run -------------------------------------------------------------------------------
@pytest.mark.parametrize("lang,view", BOTH)
def test_the_runs_tokens_price_pue_and_grid_reach_the_cost(server, browser, lang, view):
    """H800 has no catalog price: its cost reads "—" until a price is given; the tokens, price,
    PUE and grid intensity then give the API's cost and CO₂, and stay in the URL."""
    base = {"model": "llama-3-8b", "gpu": "H800-SXM", "gpus": 8, "zero": 2}
    page = _open(browser, server, lang, view, base)
    assert _api(base)["training"]["cost_usd"] is None
    assert page.get_attribute("#run", "data-cost") == ""
    for name, value in (("tokens", "1e12"), ("price", "2"), ("pue", "1.2"), ("grid_kg_per_kwh", "0.3")):
        page.fill(f"input[name={name}]", value)
    want = _api({**base, "tokens": 1e12, "price": 2.0, "pue": 1.2, "grid_kg_per_kwh": 0.3})["training"]
    page.wait_for_function(f"Number(document.querySelector('#run').dataset.cost) == {want['cost_usd']}")
    page.wait_for_function(f"Number(document.querySelector('#run').dataset.co2) == {want['co2_t']}")
    assert want["tokens"] == 1e12
    run = page.inner_text("#run")
    assert ("10,000 亿" if lang == "zh" else "1,000B") in run
    assert want["cost_usd"] > 1e4 and (" 万" if lang == "zh" else f"${want['cost_usd']:,.0f}") in run
    for part in ("tokens=1e12", "price=2", "pue=1.2", "grid_kg_per_kwh=0.3"):
        assert part in page.url
    page.close()


# 8. pictures ------------------------------------------------------------------------------------
@pytest.mark.parametrize("lang,view", BOTH)
def test_every_stage_is_drawn_with_a_legend_an_axis_and_the_accuracy_page_resolves(server, browser, lang, view):
    """GPT-3 175B over 32 pipeline stages: 32 memory bars (none skipped) labelled with their
    layers, 32 timeline rows with a legend and a time axis ending at the simulated step; the
    accuracy line links docs/accuracy.md, which the server serves."""
    state = {"model": "gpt3-175b", "gpus": 256, "tp": 8, "pp": 32, "gbs": 256}
    page = _open(browser, server, lang, view, state)
    want = _api({**state, "timeline": True})
    _peak_is(page, want["memory"]["peak_bytes"])
    rows = page.query_selector_all("#bars .bar-row")
    assert [int(r.get_attribute("data-stage")) for r in rows] == list(range(32)) == [s["stage"] for s in want["memory"]["stages"]]
    first = want["memory"]["stages"][0]["layers"]
    assert rows[0].inner_text().startswith(f"阶段 0 · {first} 层" if lang == "zh" else f"stage 0 · {first} layers")
    assert len(page.query_selector_all("#timeline .tl-row")) == 32
    legend = page.inner_text("#timeline-legend")
    assert all(w in legend for w in (("前向", "反向") if lang == "zh" else ("forward", "backward")))
    ticks = page.eval_on_selector_all("#timeline-axis .tick", "ts => ts.map(t => t.textContent)")
    step = want["timeline"]["step_s"]
    assert len(ticks) == (5 if view == "desktop" else 3) and ticks[0] == "0 ms"
    assert ticks[-1] == (f"{step:,.2f} s" if step >= 1 else f"{step * 1e3:,.1f} ms")
    assert page.is_visible("#bars-scroll")  # the long list says it scrolls
    # torch.distributed.pipelining's V-shaped schedule: a row per rank, naming its two stages, and
    # the backward split into its input and weight halves, each in the legend
    href = page.get_attribute("#accuracy a", "href")
    assert href == "/docs/accuracy.md"
    doc = page.request.get(server + href)
    assert doc.status == 200 and "<table>" in doc.text() and "published" in doc.text()
    page.close()
    v_shaped = {"model": "llama-3-8b", "gpus": 32, "tp": 8, "pp": 4, "gbs": 32, "framework": "torch", "schedule": "zbv",
                "vpp": 2}
    page = _open(browser, server, lang, view, v_shaped)
    zbv = _api({**v_shaped, "timeline": True})
    _peak_is(page, zbv["memory"]["peak_bytes"])
    assert zbv["timeline"]["rank_stages"] == [[0, 7], [1, 6], [2, 5], [3, 4]]
    labels = page.eval_on_selector_all("#timeline .tl-row .lab", "ls => ls.map(l => l.textContent)")
    assert labels == [("进程 {}：阶段 {}、{}" if lang == "zh" else "rank {}: stages {}, {}").format(i, *s)
                      for i, s in enumerate(zbv["timeline"]["rank_stages"])]
    legend = page.inner_text("#timeline-legend")
    assert all(w in legend for w in (("前向", "反向的输入梯度", "权重梯度") if lang == "zh" else
                                     ("forward", "input gradients", "weight gradients")))
    page.close()


# 9. the why -------------------------------------------------------------------------------------
def test_api_explain_terms_add_up_to_the_plan():
    """The explain key's memory terms sum to the peak stage's total and its step parts to the
    step (exact derivations of the same estimates)."""
    for body in ({"model": "llama-3-8b", "gpus": 8, "zero": 2}, {**README, "sp": True},
                 {"model": "mixtral-8x7b", "gpus": 64, "ep": 8, "pp": 4, "zero": 1},
                 {"model": "llama-3-8b", "gpus": 1, "finetune": "lora"}):
        data = _api({**body, "explain": True})
        m, t = data["explain"]["memory"], data["explain"]["time"]
        stage = data["memory"]["stages"][m["stage"]]
        assert m["total_bytes"] == pytest.approx(stage["total_bytes"], rel=1e-12)
        parts = m["weights_bytes"] + m["grads_bytes"] + m["optimizer_bytes"] + m["activations_bytes"] + sum(m["other"].values())
        assert parts == pytest.approx(m["total_bytes"], rel=1e-9)
        assert m["layers_per_micro_batch_bytes"] * m["in_flight"] == pytest.approx(m["activation_parts"]["layers"], rel=1e-12)
        every = sum(x["count"] * x["per_layer_bytes"] for x in m["activation_layers"])
        if body.get("finetune") == "lora":  # the frozen first norm keeps nothing: 32 layers less one attention norm
            assert every - m["layers_per_micro_batch_bytes"] == m["activation_layers"][0]["terms"]["attn_norm"]
        else:
            assert every == pytest.approx(m["layers_per_micro_batch_bytes"], rel=1e-12)
        assert sum(t["breakdown_s"].values()) == pytest.approx(t["step_s"], rel=1e-9)
        for part, per_layer in t["comm_per_layer_s"].items():  # each parallelism's exposed share of a micro-batch
            assert per_layer * t["stage_layers"] == pytest.approx(t["micro_batch_s"][part], rel=1e-12)
    assert "explain" not in _api({"model": "llama-3-8b"})  # only when asked: the plan's JSON as before


@pytest.mark.parametrize("lang,view", BOTH)
def test_the_explain_panel_fills_the_formulas_with_the_plans_numbers(server, browser, lang, view):
    page = _open(browser, server, lang, view)
    want = _api({"model": "llama-3-8b", "gpu": "H100-SXM", "gpus": 8, "zero": 2, "explain": True})
    _peak_is(page, want["memory"]["peak_bytes"])
    assert page.eval_on_selector("#explain", "d => d.open") == (view == "desktop")  # folded on a phone
    if view == "phone":
        page.click("#explain summary")
    m = want["explain"]["memory"]
    line = lambda kind: page.inner_text(f"#explain-body [data-line={kind}]")  # noqa: E731
    assert line("params").endswith("P = 8,030,261,248")
    assert line("weights") == ("权重" if lang == "zh" else "weights") + f" = P × 2 B = {_gib(m['weights_bytes'])}"
    assert line("grads").endswith(f"× 2 B / 8{'（ZeRO-2 分片组）' if lang == 'zh' else ' (ZeRO-2 shard group)'} = 1.87 GiB")
    assert line("per-param") == ("= 分片前每个可训练参数 16 字节（2 + 2 + 4 + 8）" if lang == "zh" else
                                 "= 16 bytes per trainable parameter before sharding (2 + 2 + 4 + 8)")
    assert line("activations").endswith(f"= {_gib(m['activations_bytes'])}")
    assert line("total") == ("合计" if lang == "zh" else "total") + f" = {_gib(m['total_bytes'])} " + \
        ("/" if lang == "zh" else "of") + " 80.00 GiB"
    step = want["time"]["step_s"]
    assert line("step").endswith(f"= {step * 1e3:,.1f} ms")
    # TP 8 on the README's layout: its collectives a layer, over the slowest stage's layers
    page.goto(page.url.split("?")[0] + "?" + "&".join(f"{k}={v}" for k, v in README.items()) + ("&lang=zh" if lang == "zh" else ""))
    page.wait_for_function("document.body.dataset.state === 'ready'")
    if view == "phone":
        page.click("#explain summary")
    t = _api({**README, "sp": True, "explain": True})["explain"]["time"]
    assert t["comm_per_layer_s"]["tp_comm"] > 0
    assert line("comm-tp_comm").startswith("TP 通信（未被计算掩盖的部分）= 每层 " if lang == "zh" else "TP comm exposed = ")
    assert line("comm-tp_comm").endswith(f"× {t['stage_layers']} " + ("层" if lang == "zh" else "layers") +
                                         f" = {t['micro_batch_s']['tp_comm'] * 1e3:,.2f} ms")
    page.close()


# 10. speed --------------------------------------------------------------------------------------
@pytest.mark.parametrize("lang,view", BOTH)
def test_a_drop_down_asks_at_once_and_a_slow_answer_shows_the_loading_state(server, browser, lang, view):
    """A drop-down's change sends its request within the change event itself (no timer), and an
    answer slower than 100 ms shows the loading state until it arrives."""
    page = _open(browser, server, lang, view)
    page.evaluate("""() => {
        window.__inChange = false; window.__sentInChange = [];
        for (const kind of ['input', 'change']) {
            window.addEventListener(kind, () => { window.__inChange = true; }, true);
            window.addEventListener(kind, () => { window.__inChange = false; });
        }
        const fetch0 = window.fetch;
        window.fetch = (...a) => { window.__sentInChange.push(window.__inChange); return fetch0(...a); };
    }""")
    held = []
    page.route("**/api/plan", lambda route: held.append(route))
    page.select_option("select[name=recompute]", "selective")
    assert page.evaluate("window.__sentInChange") == [True]
    page.wait_for_selector("#loading", state="visible")
    assert page.inner_text("#loading") == ("计算中……" if lang == "zh" else "Computing…")
    held[0].continue_()
    page.unroute("**/api/plan")
    want = _api({"model": "llama-3-8b", "gpu": "H100-SXM", "gpus": 8, "zero": 2, "recompute": "selective"})
    _peak_is(page, want["memory"]["peak_bytes"])
    page.wait_for_selector("#loading", state="hidden")
    page.close()


def test_api_serves_the_documents_the_page_cites_and_nothing_else():
    page = client.get("/docs/accuracy.md")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "<table>" in page.text and "docs/accuracy.md" in page.text
    for bad in ("/docs/nope.md", "/docs/accuracy", "/docs/..%2Fpyproject.toml", "/docs/../README.md", "/docs/README.md"):
        assert client.get(bad).status_code == 404, bad


# the server's validation rules in Chinese: the inputs the page's fields can get wrong
WRONG = [{"tp": 3}, {"tp": 16}, {"pp": 64}, {"ep": 2}, {"cp": 2, "attention": "eager"}, {"cp": 8, "seq_len": 4100},
         {"schedule": "interleaved", "pp": 2}, {"schedule": "interleaved"}, {"vpp": 2},
         {"schedule": "dualpipe", "pp": 2, "gbs": 8}, {"zero": 3, "dp_shard": 3}, {"offload_params": True},
         {"recompute_layers": 5}, {"lora_dropout": 0.1}, {"dp": 3}, {"gbs": 12},
         {"precision": "fp8", "gpu": "A100-80GB-SXM"}, {"gpu": "V100-SXM2-32GB"}, {"gpus": 16, "gpu": "RTX-4090"},
         {"gpus": 16, "gpu": "TPU-v4"}, {"framework": "fsdp", "zero": 1}, {"framework": "megatron", "reduce_dtype": "bf16"},
         {"offload_optimizer": True}, {"zero": 1, "dp_shard": 4}, {"schedule": "looped_bfs", "pp": 2},
         {"schedule": "dualpipe", "pp": 2, "gbs": 32, "framework": "torch"},
         {"model": "mixtral-8x7b", "ep": 16}, {"model": "mixtral-8x7b", "ep": 8, "gpus": 8, "tp": 2},
         {"recompute": "selective-op", "model": "mixtral-8x7b"}, {"seq_len": 100000000}, {"gpus": 0}, {"dropout": 1.5},
         {"grad_clip": -1}, {"nic_gbps": 0}, {"tokens": 0.5}, {"pp_group": 3}, {"model": "llama3-70b"}, {"gpu": "h1000"},
         {"schedule": "nope"}]


def test_every_rule_the_fields_can_break_reads_in_chinese(server, browser):
    rules = []
    for wrong in WRONG:
        res = client.post("/api/plan", json={"model": "llama-3-8b", "gpus": 8, **wrong})
        assert res.status_code == 422, wrong
        rules.append(res.json()["rule"])
    page = _open(browser, server, "zh", "desktop")
    said = page.evaluate("rules => rules.map(r => L10N.rule(r))", rules)
    assert [r for r, z in zip(rules, said, strict=True) if z is None] == []
    assert all(re.search(CJK, z) for z in said)
    page.close()


# 11. export -------------------------------------------------------------------------------------
def test_api_export_writes_the_plans_run_or_refuses_by_name():
    body = {"model": "llama-3-8b", "gpus": 8, "zero": 2, "framework": "deepspeed"}
    res = client.post("/api/export", json={**body, "target": "deepspeed", "timeline": True})
    assert res.status_code == 200
    data = res.json()
    assert data["filename"] == "ds_config.json" and '"train_batch_size": 8' in data["text"]
    assert data["text"] == client.post("/api/export", json={**body, "target": "deepspeed"}).json()["text"]
    for bad, field in (({"target": "nope"}, "target"), ({"target": "megatron"}, "framework"), ({}, "target")):
        out = client.post("/api/export", json={**body, **bad})
        assert out.status_code == 422 and out.json()["field"] == field, out.json()


@pytest.mark.parametrize("lang,view", BOTH)
def test_the_export_button_downloads_the_run_this_page_plans(server, browser, lang, view):
    """The target follows the framework whose conventions the page plans under; the file
    downloaded is the API's export of the same options; a framework with no export says so, and
    a plan a target cannot express is refused beside the button, in the page's language."""
    page = _open(browser, server, lang, view)
    base = {"model": "llama-3-8b", "gpu": "H100-SXM", "gpus": 8, "zero": 2}
    assert page.input_value("#export-target") == "deepspeed"
    assert page.eval_on_selector("#export-target", "s => [...s.options].filter(o => o.disabled).map(o => o.value)") == \
        ["megatron", "torchtitan"]
    for framework, target, name in (("deepspeed", "deepspeed", "ds_config.json"), ("megatron", "megatron", "megatron_args.txt")):
        page.select_option("select[name=framework]", framework)
        want = client.post("/api/export", json={**base, "framework": framework, "target": target}).json()
        with page.expect_download() as download:
            page.click("#export")
        assert download.value.suggested_filename == name
        assert open(download.value.path(), encoding="utf-8").read() == want["text"]
        assert name in page.inner_text("#export-status")
    page.select_option("select[name=framework]", "torch")
    assert page.is_disabled("#export")
    assert ("没有导出" if lang == "zh" else "has no export") in page.inner_text("#export-status")
    # LoRA under Megatron-LM's conventions: Megatron's arguments have no adapters
    page.select_option("select[name=framework]", "megatron")
    page.select_option("select[name=finetune]", "lora")
    page.wait_for_function("document.body.dataset.state === 'ready'")
    page.click("#export")
    page.wait_for_function("document.body.dataset.export === 'error'")
    assert ("megatron 的配置没有 LoRA 适配器" if lang == "zh" else "megatron's configuration has no LoRA adapters") in \
        page.inner_text("#export-status")
    page.close()


# import a configuration ----------------------------------------------------------------------
DATA = __import__("pathlib").Path(__file__).parent / "data" / "imports"


def test_api_import_reads_a_config_and_refuses_by_name():
    """POST /api/import: Megatron-LM's Llama 3 8B FP8 example (tests/data/imports/SOURCE) gives the
    options `plan --from` gives; a DeepSpeed JSON needs the model it trains; bad input is a 422
    naming the field."""
    from trainplan.imports import merge, read_config

    script = DATA / "megatron_train_llama3_8b_h100_fp8.sh"
    res = client.post("/api/import", json={"text": script.read_text(), "name": script.name})
    assert res.status_code == 200, res.json()
    data = res.json()
    assert data["format"] == "megatron" and data["options"] == merge(read_config(script), {})
    assert data["options"]["fp8_params"] is True and data["options"]["gbs"] == 128
    ds = (DATA / "deepspeed_ds_config_fp16_z3.json").read_text()
    out = client.post("/api/import", json={"text": ds, "name": "ds_config.json"})
    assert out.status_code == 422 and out.json()["field"] == "model"
    ok = client.post("/api/import", json={"text": ds, "name": "ds_config.json", "model": "llama-3-8b"}).json()
    assert ok["format"] == "deepspeed" and ok["options"]["zero"] == 3 and ok["options"]["precision"] == "fp16"
    for body, field in (({"text": ""}, "text"), ({"text": "x", "name": "../etc/passwd"}, "name"),
                        ({"text": "x" * 200_001}, "text"), ({"text": "x", "model": "/etc/passwd"}, "model"),
                        ({"text": "x", "gpus": 8}, "gpus")):
        got = client.post("/api/import", json=body)
        assert got.status_code == 422 and got.json()["field"] == field, (body.get("name"), got.json())


@pytest.mark.parametrize("lang,view", [("en", "desktop"), ("zh", "phone")])
def test_an_imported_launch_script_becomes_the_pages_plan(server, browser, lang, view):
    """Pasting Megatron-LM's Llama 3 8B FP8 example and pressing Import puts its run on the page
    (8 GPUs, FP8 with FP8 weights, global batch 128, Megatron's conventions): the verdict is the
    CLI's for `plan --from` (it fits, 78.36 GiB), and the inputs the page lacks are named."""
    page = _open(browser, server, lang, view)
    script = DATA / "megatron_train_llama3_8b_h100_fp8.sh"
    if view == "phone":  # pasted
        page.fill("#import-text", script.read_text())
    else:  # chosen as a file (the page's own translated button opens the chooser)
        with page.expect_file_chooser() as chooser:
            page.click("#import-choose")
        chooser.value.set_files(str(script))
        page.wait_for_function("document.querySelector('#import-text').value.length > 0")
        assert page.inner_text("#import-name") == script.name
    page.click("#import")
    page.wait_for_function("document.body.dataset.import === 'ready'")
    page.wait_for_function("document.body.dataset.state === 'ready' && !location.search.includes('zero=2')")
    assert page.input_value("select[name=framework]") == "megatron"
    assert page.input_value("select[name=precision]") == "fp8" and page.input_value("[name=gbs]") == "128"
    status = page.inner_text("#import-status")
    assert ("Megatron-LM" in status) and (("已读取" in status) if lang == "zh" else ("config read" in status))
    # the CLI's plan of the file on the same accelerator as the page's
    from trainplan import api

    gpu = page.input_value("select[name=gpu]")
    want = api.plan(from_file=str(DATA / "megatron_train_llama3_8b_h100_fp8.sh"), gpu=gpu)["memory"]
    _peak_is(page, want["peak_bytes"])
    assert want["fits"] and page.get_attribute("#fit", "data-fits") == "true"
    page.close()
