// The explorer: inputs <-> URL query, one debounced /api/plan request per change.
(() => {
  const form = document.getElementById("controls");
  const $ = (id) => document.getElementById(id);
  const GiB = 2 ** 30;
  const POW2 = [1, 2, 4, 8, 16, 32, 64, 128];
  let lang = new URLSearchParams(location.search).get("lang") === "zh" ? "zh" : "en";
  let last = null, timer = null, inflight = null;

  const t = (key, vars = {}) => (I18N[lang][key] || I18N.en[key] || key)
    .replace(/\{(\w+)\}/g, (_, k) => (vars[k] !== undefined ? vars[k] : ""));

  function fillPow2(name, max) {
    const sel = form.elements[name];
    for (const v of POW2.filter((x) => x <= max)) sel.add(new Option(v, v));
  }

  function applyLanguage() {
    document.documentElement.lang = lang === "zh" ? "zh-CN" : "en";
    document.querySelectorAll("[data-i18n]").forEach((el) => { el.textContent = t(el.dataset.i18n); });
    $("lang").textContent = lang === "zh" ? "English" : "中文";
    if (last) render(last);
    if (lastSearch) renderSearch(lastSearch);
    if (lastCompare) renderCompare(lastCompare);
  }

  function readForm() {
    const out = {};
    for (const el of form.elements) {
      if (!el.name || el.disabled) continue;
      if (el.type === "checkbox") { if (el.checked) out[el.name] = true; continue; }
      const v = el.value.trim();
      if (v !== "") out[el.name] = v;
    }
    return out;
  }

  function toRequest(state) {
    const body = { timeline: true };
    for (const [k, v] of Object.entries(state)) {
      if (k === "hf_config") continue;
      if (k === "no_master_weights") body.master_weights = false;
      else if (["model", "gpu", "recompute", "schedule", "precision", "optimizer", "optimizer_impl", "attention", "cp_comm", "reduce_dtype", "optimizer_state_dtype", "framework", "finetune"].includes(k)) body[k] = v;
      else if (["sp", "sharp", "overlap_tp", "fused_loss", "recompute_early_stop", "fused_kernels", "offload_optimizer",
                "offload_params"].includes(k)) body[k] = true;
      else body[k] = Number(v);
    }
    if (state.hf_config) {
      try { body.hf_config = JSON.parse(state.hf_config); delete body.model; }
      catch (e) { return { error: { field: "hf_config", rule: "must be valid JSON (" + e.message + ")" } }; }
    }
    return { body };
  }

  function writeUrl(state) {
    const q = new URLSearchParams(state);
    if (lang === "zh") q.set("lang", "zh");
    history.replaceState(null, "", location.pathname + "?" + q.toString());
  }

  function readUrl() {
    const q = new URLSearchParams(location.search);
    for (const el of form.elements) {
      if (!el.name || !q.has(el.name)) continue;
      if (el.type === "checkbox") el.checked = q.get(el.name) === "true";
      else el.value = q.get(el.name);
    }
  }

  function clearErrors() {
    form.querySelectorAll(".field-error").forEach((e) => e.remove());
    form.querySelectorAll(".invalid").forEach((e) => e.classList.remove("invalid"));
    $("error").hidden = true;
  }

  function showError(field, rule) {
    const el = form.elements[field];
    const msg = document.createElement("span");
    msg.className = "field-error";
    msg.dataset.field = field;
    msg.textContent = `${field}: ${rule}`;
    if (el && el.closest) { el.classList.add("invalid"); el.closest("label").appendChild(msg); }
    $("error").hidden = false;
    $("error").textContent = `${t("error")} — ${field}: ${rule}`;
  }

  function schedule() {
    clearTimeout(timer);
    timer = setTimeout(update, 250);  // debounced: one request per change, not per keystroke
  }

  // FSDP's sharding strategies are ZeRO-0, 2 and 3: it has no ZeRO-1
  function offerZeroStages() {
    const fsdp = form.elements.framework.value.startsWith("fsdp");
    for (const o of form.elements.zero.options) o.disabled = fsdp && o.value === "1";
  }

  // only full recomputation re-runs a chosen number of each stage's layers; the adapters'
  // settings apply to LoRA and QLoRA, the base's bits to QLoRA
  function offerDependentFields() {
    form.elements.recompute_layers.disabled = form.elements.recompute.value !== "full";
    const tuning = form.elements.finetune.value;
    form.elements.lora_rank.disabled = form.elements.lora_dropout.disabled = tuning === "full";
    form.elements.qlora_bits.disabled = tuning !== "qlora";
  }

  async function update() {
    offerZeroStages();
    offerDependentFields();
    const state = readForm();
    writeUrl(state);
    clearErrors();
    const req = toRequest(state);
    if (req.error) { showError(req.error.field, req.error.rule); return; }
    if (inflight) inflight.abort();
    inflight = new AbortController();
    try {
      const res = await fetch("/api/plan", { method: "POST", headers: { "Content-Type": "application/json" },
        body: JSON.stringify(req.body), signal: inflight.signal });
      const data = await res.json();
      if (!res.ok) { showError(data.field || "body", data.rule || res.statusText); return; }
      last = data;
      render(data);
      document.body.dataset.state = "ready";
    } catch (e) { if (e.name !== "AbortError") showError("body", String(e)); }
  }

  const fmt = (x, d = 2) => Number(x).toLocaleString(lang === "zh" ? "zh-CN" : "en-US",
    { maximumFractionDigits: d, minimumFractionDigits: d });
  const pct = (x) => (100 * x).toFixed(1) + "%";
  const dur = (s) => (s >= 86400 ? fmt(s / 86400, 1) + " d" : s >= 1 ? fmt(s, 2) + " s" : fmt(s * 1e3, 1) + " ms");

  function render(d) {
    const mem = d.memory, cap = mem.capacity_bytes;
    const fit = $("fit");
    const peak = mem.peak_bytes;
    fit.className = "fit " + (mem.fits ? "ok" : "no");
    fit.dataset.fits = String(mem.fits);
    fit.dataset.peak = String(peak);
    fit.textContent = mem.fits
      ? t("fits", { peak: fmt(peak / GiB), cap: fmt(cap / GiB, 0), stage: mem.peak_stage, free: fmt((cap - peak) / GiB) })
      : t("no_fit", { peak: fmt(peak / GiB), cap: fmt(cap / GiB, 0), stage: mem.peak_stage, over: fmt((peak - cap) / GiB) });
    // params, grads, fp32 master, optimizer state, activations, logits + loss, buffers (other)
    const segs = [["params", (s) => s.params_bytes], ["grads", (s) => s.grads_bytes],
      ["master", (s) => s.components.master], ["optimizer", (s) => s.components.optimizer_state],
      ["activations", (s) => s.activations_bytes - s.components.activation_parts.head_and_loss],
      ["logits", (s) => s.components.activation_parts.head_and_loss], ["other", (s) => s.other_bytes]];
    const segName = (c) => t(c === "optimizer" ? "optimizer_state" : c);
    const scale = Math.max(cap, peak);
    const bars = $("bars");
    bars.innerHTML = "";
    const stages = mem.stages.length > 16 ? mem.stages.filter((s, i) => i < 8 || i >= mem.stages.length - 8) : mem.stages;
    for (const s of stages) {
      const row = document.createElement("div");
      row.className = "bar-row";
      row.dataset.stage = s.stage;
      row.dataset.total = String(s.total_bytes);
      const bar = document.createElement("div");
      bar.className = "bar";
      for (const [cls, value] of segs) {
        const seg = document.createElement("div");
        seg.className = "seg " + cls;
        seg.style.width = (100 * value(s) / scale) + "%";
        seg.title = `${segName(cls)}: ${fmt(value(s) / GiB)} GiB`;
        bar.appendChild(seg);
      }
      const capLine = document.createElement("div");
      capLine.className = "cap";
      capLine.style.left = (100 * cap / scale) + "%";
      bar.appendChild(capLine);
      row.innerHTML = `<span>${t("stage")} ${s.stage} (${s.layers})</span>`;
      row.appendChild(bar);
      const total = document.createElement("span");
      total.className = "total";
      total.textContent = `${fmt(s.total_bytes / GiB)} / ${fmt(cap / GiB, 0)} GiB`;
      row.appendChild(total);
      bars.appendChild(row);
    }
    $("legend").innerHTML = segs.map(([c]) => `<span><i class="seg ${c}"></i>${segName(c)}</span>`).join("");

    const tm = d.time, tr = d.training;
    $("speed").dataset.step = String(tm.step_s);
    $("speed").innerHTML = [[t("step"), dur(tm.step_s)], [t("tokens_s"), fmt(tm.tokens_per_s, 0)],
      [t("tflops"), fmt(tm.tflops_per_gpu, 0)], [t("mfu"), pct(tm.mfu) + (tm.mfu_peak === "fp8"
        ? " " + t("mfu_fp8", { bf16: pct(tm.mfu_bf16_peak) }) : "")], [t("bubble"), pct(tm.bubble_fraction)],
      [t("max_mbs"), mem.max_mbs]].map(([k, v]) => `<span>${k}: <b>${v}</b></span>`).join("");
    $("accuracy").textContent = accuracyText(tm.accuracy, d.gpu.name);
    const colours = { compute: "#4c9be8", tp_comm: "#e74c3c", pp_comm: "#f39c12", dp_comm: "#8e44ad",
      ep_comm: "#16a085", cp_comm: "#d35400", bubble: "#bdc3c7", optimizer: "#7f8c8d", data: "#2c3e50" };
    const total = Object.values(tm.breakdown_s).reduce((a, b) => a + b, 0) || 1;
    $("breakdown").innerHTML = Object.entries(tm.breakdown_s).filter(([, v]) => v > 0).map(([k, v]) =>
      `<div style="width:${100 * v / total}%;background:${colours[k] || "#999"}" title="${t(k === "optimizer" ? "optimizer_time" : k)} ${pct(v / total)}"></div>`).join("");
    $("breakdown-legend").innerHTML = Object.entries(tm.breakdown_s).filter(([, v]) => v > 0.005 * total).map(([k, v]) =>
      `<span><i style="background:${colours[k] || "#999"}"></i>${t(k === "optimizer" ? "optimizer_time" : k)} ${pct(v / total)}</span>`).join("");
    $("run").innerHTML = [[t("tokens"), fmt(tr.tokens / 1e9, 0) + " B"], [t("days"), fmt(tr.days, 1)],
      [t("gpu_hours"), fmt(tr.gpu_hours, 0)], [t("cost"), tr.cost_usd == null ? "—" : "$" + fmt(tr.cost_usd, 0)],
      [t("energy"), fmt(tr.energy_kwh, 0) + " kWh"], [t("co2"), fmt(tr.co2_t, 1) + " t"], [t("goodput"), pct(tr.goodput)]]
      .map(([k, v]) => `<span>${k}: <b>${v}</b></span>`).join("");
    renderTimeline(d.timeline);
    renderHints(d);
  }

  // How far to trust the step time: the error on published runs (docs/accuracy.md)
  function accuracyText(a, gpu) {
    if (!a) return "";
    const beyond = (a.beyond || []).length ? " " + t("acc_beyond", { what: a.beyond.map((b) => t("acc_beyond_" + b)).join(" / ") }) : "";
    const moe = a.moe_plan && a.moe_runs && !(a.beyond || []).includes("moe") ? " " + t("acc_moe_runs", { n: a.moe_runs }) : "";
    return accuracyBasis(a, gpu) + moe + beyond;
  }

  function accuracyBasis(a, gpu) {
    if (a.basis === "profile") return t("acc_profile");
    if (a.compared_on === null) return t("acc_none", { gpu });
    const fitted = a.fitted_runs ? t("acc_fitted", { n: a.fitted_runs }) : "";
    const vars = { runs: a.runs, fitted, on: a.compared_on, gpu, mean: pct(a.mean_abs_error), worst: pct(a.worst_abs_error) };
    return t(a.compared_on === gpu ? "acc_runs" : "acc_shared", vars);
  }

  function renderTimeline(tl) {
    const box = $("timeline");
    box.innerHTML = "";
    if (!tl) return;
    const stages = Math.max(...tl.ops.map((o) => o[0])) + 1;
    for (let s = 0; s < Math.min(stages, 16); s++) {
      const row = document.createElement("div");
      row.className = "tl-row";
      row.innerHTML = `<span class="lab">${t("stage")} ${s}</span>`;
      for (const [st, kind, mb, a, b] of tl.ops) {
        if (st !== s) continue;
        const op = document.createElement("div");
        op.className = "tl-op " + kind;
        op.style.left = (100 * a / tl.step_s) + "%";
        op.style.width = Math.max(0.2, 100 * (b - a) / tl.step_s) + "%";
        op.title = `${kind}${mb}`;
        row.appendChild(op);
      }
      box.appendChild(row);
    }
  }

  const escapeHtml = (s) => String(s).replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" }[c]));

  function renderHints(d) {
    const hints = [], p = d.parallel, mem = d.memory, tm = d.time;
    // the plan's own warnings first, in the page's language where it has their wording (the
    // TP-across-nodes one is the first hint below)
    for (const w of d.warning_details || []) {
      if (w.code === "tp_across_nodes") continue;
      const key = "warn_" + w.code;
      hints.push("⚠️ " + escapeHtml(I18N[lang][key] ? t(key, w.params) : w.message));
    }
    if (p.tp > d.gpu.gpus_per_node) hints.push(t("hint_tp_nvlink", { tp: p.tp, gpn: d.gpu.gpus_per_node }));
    if (tm.bubble_fraction > 0.1) hints.push(t("hint_bubble", { bubble: pct(tm.bubble_fraction) }));
    if (!mem.fits) hints.push(t("hint_no_fit"));
    const worst = mem.stages.reduce((a, b) => (b.total_bytes > a.total_bytes ? b : a));
    if (worst.activations_bytes > 0.4 * worst.total_bytes && p.recompute === "none")
      hints.push(t("hint_recompute", { share: pct(worst.activations_bytes / worst.total_bytes) }));
    if (p.zero === 0 && p.dp > 1)
      hints.push(d.recipe.framework.startsWith("fsdp") ? t("hint_zero_fsdp") : t("hint_zero", { zero: 1 }));
    const comm = Object.entries(tm.breakdown_s).filter(([k]) => k.endsWith("_comm")).sort((a, b) => b[1] - a[1])[0];
    if (comm && comm[1] > 0.15 * tm.step_s) {
      const share = pct(comm[1] / tm.step_s);
      hints.push(comm[0] === "tp_comm" && !form.elements.overlap_tp.checked
        ? t("hint_tp_overlap", { share }) : t("hint_tp_bound", { what: t(comm[0]), share }));
    }
    if (!hints.length) hints.push(t("hint_fine"));
    $("hints").innerHTML = hints.map((h) => `<li>${h}</li>`).join("");
  }

  let lastSearch = null;

  function renderSearch(data) {
    $("search-status").textContent = t("search_done", { n: data.evaluated.toLocaleString(), fit: data.feasible.toLocaleString(),
      gbs: data.gbs.toLocaleString() });
    const list = $("search-results");
    list.innerHTML = "";
    for (const b of data.best) {
      const p = b.parallel;
      const li = document.createElement("li");
      const a = document.createElement("a");
      a.href = "#";
      a.className = "search-result";
      const zero = p.zero + (p.zero >= 1 && p.dp_shard < p.dp ? t("search_shard", { n: p.dp_shard }) : "");
      a.textContent = t("search_row", { tp: p.tp, pp: p.pp, dp: p.dp, cp: p.cp, zero, mbs: p.mbs,
        rc: p.recompute, sched: p.schedule + (p.vpp > 1 ? " v" + p.vpp : ""), step: dur(b.time.step_s),
        mfu: pct(b.time.mfu), peak: fmt(b.memory.peak_bytes / GiB) });
      a.addEventListener("click", (ev) => { ev.preventDefault(); loadLayout(p); });
      li.appendChild(a);
      list.appendChild(li);
    }
  }

  // a layout found by a search or a comparison, into the form
  function loadLayout(p, gpu) {
    if (gpu) { form.elements.gpu.value = gpu; showLinks(); }
    for (const k of ["tp", "pp", "cp", "ep", "zero", "mbs", "recompute", "schedule"]) form.elements[k].value = String(p[k]);
    form.elements.vpp.value = p.schedule === "interleaved" ? String(p.vpp) : "";
    form.elements.dp.value = "";
    form.elements.recompute_layers.value = "";  // a search recomputes every layer it recomputes
    form.elements.gbs.value = String(p.gbs);
    form.elements.sp.checked = !!p.sp;
    update();
  }

  // the plan's options without its layout (and, to compare accelerators, without its accelerator)
  function searchBody(without = []) {
    const req = toRequest(readForm());
    if (req.error) { showError(req.error.field, req.error.rule); return null; }
    const body = req.body;
    delete body.timeline;
    for (const k of ["tp", "pp", "dp", "cp", "ep", "zero", "mbs", "recompute", "recompute_layers", "schedule", "vpp", "sp",
                     ...without]) delete body[k];
    return body;
  }

  async function post(url, body, status) {
    $(status).textContent = t(url.endsWith("search") ? "searching" : "comparing");
    const res = await fetch(url, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
    const data = await res.json();
    if (!res.ok) { $(status).textContent = ""; showError(data.field || "body", data.rule || res.statusText); return null; }
    return data;
  }

  async function findBest() {
    const body = searchBody();
    if (!body) return;
    body.top = 5;
    const data = await post("/api/search", body, "search-status");
    if (!data) return;
    lastSearch = data;
    renderSearch(data);
    document.body.dataset.search = "ready";
  }

  let lastCompare = null;

  function renderCompare(data) {
    const first = data.rows.find((x) => x.best);
    const par = first ? first.best.parallel : null;
    $("compare-status").textContent = par ? t("compare_done", { gpus: first.best.gpu.gpus.toLocaleString(),
      gbs: par.gbs.toLocaleString(), seq: par.seq_len.toLocaleString(), rank: t("rank_" + data.objective) }) : "";
    const table = $("compare-results");
    table.innerHTML = "";
    const head = table.createTHead().insertRow();
    for (const c of t("compare_cols").split("|")) head.appendChild(document.createElement("th")).textContent = c;
    const body = table.createTBody();
    for (const r of data.rows.filter((x) => x.best)) {
      const b = r.best, p = b.parallel, acc = b.time.accuracy || {};
      const row = body.insertRow();
      row.className = "compare-row";
      row.dataset.gpu = r.gpu;
      const layout = `TP ${p.tp} · PP ${p.pp} · DP ${p.dp} · CP ${p.cp} · ZeRO ${p.zero} · ${p.recompute}`;
      const cost = b.training.cost_usd === null ? "—" : "$" + fmt(b.training.cost_usd, 0);
      const error = acc.compared_on ? `${pct(acc.mean_abs_error)} (${acc.runs})` : t("compare_error_none");
      for (const cell of [r.gpu, layout, fmt(b.time.tokens_per_s, 0), pct(b.time.mfu), fmt(b.training.days, 1), cost, error])
        row.insertCell().textContent = cell;
      row.addEventListener("click", () => loadLayout(p, r.gpu));
    }
    $("compare-skipped").innerHTML = "";
    for (const r of data.rows.filter((x) => !x.best))
      $("compare-skipped").appendChild(document.createElement("li")).textContent = `${r.gpu}: ${r.reason}`;
  }

  async function compareAll() {
    const body = searchBody(["gpu"]);
    if (!body) return;
    body.compare_gpus = "all";
    body.objective = $("compare-objective").value;
    const data = await post("/api/compare", body, "compare-status");
    if (!data) return;
    lastCompare = data;
    renderCompare(data);
    document.body.dataset.compare = "ready";
  }

  // the accelerator's own links (and how many GPUs share one), shown where the plan gives none
  let catalogGpus = [];
  function showLinks() {
    const g = catalogGpus.find((x) => x.name === form.elements.gpu.value);
    form.elements.scale_up_gbs.placeholder = g && g.scale_up_gbs ? String(g.scale_up_gbs) : "—";
    form.elements.nic_gbps.placeholder = g && g.nic_gbps ? String(g.nic_gbps) : "—";
    form.elements.gpus_per_node.placeholder = g ? String(g.scale_up_domain) : "8";
  }

  async function init() {
    fillPow2("tp", 64); fillPow2("pp", 128); fillPow2("cp", 32); fillPow2("ep", 128);
    const [models, gpus] = await Promise.all([fetch("/api/models").then((r) => r.json()), fetch("/api/gpus").then((r) => r.json())]);
    for (const m of models) $("model").add(new Option(`${m.name} (${(m.params / 1e9).toFixed(1)}B)`, m.name));
    for (const g of gpus) $("gpu").add(new Option(`${g.name} (${g.memory_gib} GiB)`, g.name));
    catalogGpus = gpus;
    $("model").value = "llama-3-8b"; $("gpu").value = "H100-SXM";
    readUrl();
    showLinks();
    $("gpu").addEventListener("change", showLinks);
    form.addEventListener("input", schedule);
    form.addEventListener("change", schedule);
    $("lang").addEventListener("click", () => { lang = lang === "en" ? "zh" : "en"; applyLanguage(); writeUrl(readForm()); });
    $("find").addEventListener("click", findBest);
    $("compare").addEventListener("click", compareAll);
    $("compare-objective").addEventListener("change", () => { if (lastCompare) compareAll(); });
    applyLanguage();
    update();
  }
  init();
})();
