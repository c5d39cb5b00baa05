// The explorer: inputs <-> URL query, one /api/plan request per change (drop-downs and boxes at
// once, typing after a pause of TYPING_PAUSE_MS), the answer drawn by View and Explain.
(() => {
  const form = document.getElementById("controls");
  const $ = (id) => document.getElementById(id);
  const t = (k, v) => L10N.t(k, v);
  const POW2 = [1, 2, 4, 8, 16, 32, 64, 128];
  const TYPING_PAUSE_MS = 80;  // one request per typed number, not per keystroke
  const SLOW_MS = 100;  // an answer slower than this shows the loading state
  // The first screen (a bare URL): Llama 3 8B on 8 H100 with ZeRO-2. `trainplan plan --model
  // llama-3-8b --gpus 8 --zero 2` fits with 14.40 GiB to spare at the 447.5 ms step of ZeRO-1
  // (which leaves 0.66 GiB); the framework's own default, ZeRO-0, needs 161.79 GiB of 80.
  const STARTER = { model: "llama-3-8b", gpu: "H100-SXM", zero: "2" };
  const LAYOUT = ["tp", "pp", "cp", "ep"];
  const TORCH_ONLY = ["looped_bfs", "zbv", "dualpipev"];  // torch.distributed.pipelining's schedules
  const query = new URLSearchParams(location.search);
  L10N.lang = query.get("lang") === "zh" ? "zh" : "en";
  let last = null, lastError = null, lastBody = null, timer = null, inflight = null, slowTimer = null;
  let lastChanged = null, urlNotes = [], models = [], gpus = [], lastSearch = null, lastCompare = null;

  const norm = (s) => String(s).trim().toLowerCase().replace(/_/g, "-").replace(/ /g, "-");

  function fieldLabel(name) {
    const el = form.elements[name];
    const label = el && el.closest ? el.closest("label") : null;
    if (!label) return name;
    const span = label.querySelector("span[data-i18n]");
    return span ? span.textContent : label.firstChild.textContent.trim();
  }

  function applyLanguage() {
    document.documentElement.lang = L10N.lang === "zh" ? "zh-CN" : "en";
    document.querySelectorAll("[data-i18n]").forEach((el) => { el.textContent = t(el.dataset.i18n); });
    document.querySelectorAll("[data-i18n-ph]").forEach((el) => { el.placeholder = t(el.dataset.i18nPh); });
    for (const sel of form.querySelectorAll("select")) {
      for (const o of sel.options) {
        if (o.dataset.i18n || o.dataset.fromUrl) continue;
        if (sel.name === "model") {
          const m = models.find((x) => x.name === o.value);
          if (m) o.textContent = t("model_option", { name: m.name, params: L10N.big(m.params) });
        } else if (sel.name === "gpu") {
          const g = gpus.find((x) => x.name === o.value);
          if (g) o.textContent = t("gpu_option", { name: g.name, mem: g.memory_gib });
        } else if (!LAYOUT.includes(sel.name)) o.textContent = View.opt(sel.name, o.value);
      }
    }
    $("lang").textContent = L10N.lang === "zh" ? "English" : "中文";
    offerLayouts();
    offerExport();
    showUrlNotes();
    if (lastError) { clearErrors(); showError(lastError.field, lastError.rule, lastError.on); } else if (last) draw(last);
    if (lastSearch) View.searchRows(lastSearch, loadLayout);
    if (lastCompare) View.compareRows(lastCompare, loadLayout, fieldLabel);
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

  const WORDS = ["model", "gpu", "recompute", "schedule", "precision", "optimizer", "optimizer_impl", "attention", "cp_comm",
    "reduce_dtype", "optimizer_state_dtype", "grad_dtype", "framework", "finetune"];
  const BOXES = ["sp", "sharp", "overlap_tp", "fused_loss", "fp8_params", "recompute_early_stop", "fused_kernels", "offload_optimizer",
    "offload_params"];

  function toRequest(state) {
    const body = { timeline: true, explain: true };
    for (const [k, v] of Object.entries(state)) {
      if (k === "hf_config") continue;
      if (k === "no_master_weights") body.master_weights = false;
      else if (WORDS.includes(k)) body[k] = v;
      else if (BOXES.includes(k)) body[k] = true;
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
    if (L10N.lang === "zh") q.set("lang", "zh");
    history.replaceState(null, "", location.pathname + "?" + q.toString());
  }

  // A catalog name as the CLI reads it (case, "_" and spaces aside; the accelerators' aliases)
  function catalogName(field, value) {
    const list = field === "gpu" ? gpus.map((g) => [g.name, [g.name, ...(g.aliases || [])]])
      : models.map((m) => [m.name, [m.name]]);
    const hit = list.find(([, names]) => names.some((n) => norm(n) === norm(value)));
    return hit ? hit[0] : null;
  }

  // Every URL parameter goes into its input; what cannot is said, naming it (`params`: the URL's,
  // or an imported configuration's as [key, value] pairs)
  function readUrl(params = query) {
    const notes = [];
    for (const [key, value] of params) {
      if (key === "lang") continue;
      const el = form.elements[key];
      if (!el || !el.name || el instanceof RadioNodeList) { notes.push(["url_unknown_param", { key, value }]); continue; }
      if (el.type === "checkbox") {
        if (value === "true" || value === "false") el.checked = value === "true";
        else notes.push(["url_adjusted", { key, value, now: "false" }]);
        continue;
      }
      if (el.tagName === "SELECT") {
        if ([...el.options].some((o) => o.value === value)) { el.value = value; continue; }
        const name = ["model", "gpu"].includes(key) ? catalogName(key, value) : null;
        if (name) { el.value = name; notes.push(["url_alias", { key, value, name }]); continue; }
        // kept as given: the plan's answer says what is wrong with it, on this field
        const o = new Option(value + " ✗", value);
        o.dataset.fromUrl = "1";
        el.add(o);
        el.value = value;
        notes.push(["url_unknown_value", { key, value }]);
        lastChanged = key;
        continue;
      }
      el.value = value;
      if (el.value !== value) notes.push(["url_adjusted", { key, value, now: el.value || t("auto") }]);
    }
    if (params === query) urlNotes = notes;
    return notes;
  }

  function showUrlNotes() {
    const box = $("url-warnings");
    box.hidden = !urlNotes.length;
    box.innerHTML = "";
    for (const [key, vars] of urlNotes) {
      const li = box.appendChild(document.createElement("li"));
      li.dataset.key = vars.key;
      li.textContent = "⚠️ " + t(key, vars);
    }
  }

  // Layout choices the model and the GPU count allow; the others stay listed, disabled and marked
  function offerLayouts() {
    const m = form.elements.hf_config.value.trim() ? null : models.find((x) => x.name === form.elements.model.value);
    const n = Number(form.elements.gpus.value) || 0;
    const v = (name) => Number(form.elements[name].value) || 1;
    const fits = (prod) => !n || n % prod === 0;
    const ok = {
      tp: (x) => (!m || m.heads % x === 0) && fits(x * v("pp") * v("cp")),
      pp: (x) => (!m || x <= m.layers) && fits(v("tp") * x * v("cp")),
      cp: (x) => fits(v("tp") * v("pp") * x),
      ep: (x) => x === 1 || ((!m || (m.experts > 1 && m.experts % x === 0)) && (!n || (n / (v("tp") * v("pp"))) % x === 0)),
    };
    // schedules that interleave or split stages need a pipeline (dualpipe an even one);
    // torch.distributed.pipelining's own run under its framework
    const pp = v("pp"), torch = form.elements.framework.value === "torch";
    for (const o of form.elements.schedule.options) {
      const good = (!["interleaved", "zb", "dualpipe", ...TORCH_ONLY].includes(o.value) ||
        (pp >= 2 && (o.value !== "dualpipe" || pp % 2 === 0))) && (!TORCH_ONLY.includes(o.value) || torch)
        && (o.value !== "dualpipe" || !torch);  // torch.distributed.pipelining has DualPipeV only
      o.disabled = !good;
      o.title = good ? "" : t("option_invalid");
    }
    for (const name of LAYOUT) {
      for (const o of form.elements[name].options) {
        if (o.dataset.fromUrl) continue;
        const good = ok[name](Number(o.value));
        o.disabled = !good;
        o.textContent = good ? o.value : o.value + " ✗";
        o.title = good ? "" : t("option_invalid");
      }
    }
  }

  function clearErrors() {
    form.querySelectorAll(".field-error").forEach((e) => e.remove());
    form.querySelectorAll(".invalid").forEach((e) => e.classList.remove("invalid"));
    $("error").hidden = true;
  }

  // The field to blame: the server names the constrained field (gpus must be a multiple of tp x
  // pp x cp); when the rule names the field just changed, that change caused it
  function blame(field, rule) {
    if (lastChanged && lastChanged !== field && form.elements[lastChanged] && new RegExp(`\\b${lastChanged}\\b`).test(rule))
      return lastChanged;
    return field;
  }

  function showError(field, rule, on) {
    on = on || blame(field, rule);
    lastError = { field, rule, on };
    const said = L10N.rule(rule);
    const text = t("field_rule", { field: fieldLabel(field), rule: said ?? rule });
    const el = form.elements[on];
    const msg = document.createElement("span");
    msg.className = "field-error";
    msg.dataset.field = on;
    msg.textContent = text;
    if (said === null) msg.lang = "en";  // a rule without a Chinese wording, shown as the server wrote it
    if (el && el.closest && el.closest("label")) { el.classList.add("invalid"); el.closest("label").appendChild(msg); }
    $("error").hidden = false;
    $("error").textContent = t("error_line", { msg: text });
  }

  // Results of other inputs are withdrawn while these cannot be planned
  function withdraw() {
    last = null;
    document.body.dataset.state = "error";
    $("result-body").hidden = true;
    $("withdrawn").hidden = false;
    const fit = $("fit");
    fit.className = "fit no";
    delete fit.dataset.peak;
    delete fit.dataset.fits;
    fit.textContent = "⛔ " + t("error");
    $("summary-bar").innerHTML = "";
    $("summary-speed").textContent = "";
  }

  // what the plan resolved, where the inputs were left to it
  function showResolved(p) {
    const auto = (v) => t("auto_value", { v: L10N.num(v, 0) });
    form.elements.dp.placeholder = auto(p.dp);
    form.elements.gbs.placeholder = auto(p.gbs);
    form.elements.seq_len.placeholder = auto(p.seq_len);
    form.elements.dp_shard.placeholder = auto(p.dp_shard);
    const zero = form.elements.zero.options[0];
    zero.textContent = t("zero_default") + " → " + p.zero;
  }

  function draw(data) {
    $("result-body").hidden = false;
    $("withdrawn").hidden = true;
    showResolved(data.parallel);
    View.render(data, form.elements.overlap_tp.checked);
    document.body.dataset.renders = String(Number(document.body.dataset.renders || 0) + 1);
  }

  function slow(on) {
    clearTimeout(slowTimer);
    if (on) slowTimer = setTimeout(() => { $("loading").hidden = false; document.body.dataset.loading = "true"; }, SLOW_MS);
    else { $("loading").hidden = true; delete document.body.dataset.loading; }
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
    // virtual stages: the interleaved schedules and torch's stages-per-rank ones only
    form.elements.vpp.disabled = !["interleaved", ...TORCH_ONLY].includes(form.elements.schedule.value);
    const tuning = form.elements.finetune.value;
    form.elements.lora_rank.disabled = form.elements.lora_dropout.disabled = tuning === "full";
    form.elements.qlora_bits.disabled = tuning !== "qlora";
    form.elements.fp8_params.disabled = form.elements.precision.value !== "fp8";
  }

  async function update() {
    clearTimeout(timer);
    offerZeroStages();
    offerDependentFields();
    offerLayouts();
    offerExport();
    const state = readForm();
    writeUrl(state);
    const req = toRequest(state);
    if (req.error) { clearErrors(); showError(req.error.field, req.error.rule); withdraw(); lastBody = null; return; }
    const text = JSON.stringify(req.body);
    if (text === lastBody) return;  // the same plan (a blur after typing, a repeated event)
    lastBody = text;
    if (inflight) inflight.abort();
    const mine = inflight = new AbortController();
    slow(true);
    try {
      const res = await fetch("/api/plan", { method: "POST", headers: { "Content-Type": "application/json" },
        body: text, signal: mine.signal });
      const data = await res.json();
      if (mine !== inflight) return;
      clearErrors();
      if (!res.ok) { showError(data.field || "body", data.rule || res.statusText); withdraw(); return; }
      lastError = null;
      last = data;
      draw(data);
      document.body.dataset.state = "ready";
    } catch (e) {
      if (e.name !== "AbortError" && mine === inflight) { clearErrors(); showError("body", String(e)); withdraw(); lastBody = null; }
    } finally {
      if (mine === inflight) { inflight = null; slow(false); }
    }
  }

  function changed(ev) {
    const el = ev.target;
    if (!el.name) return;
    lastChanged = el.name;
    clearTimeout(timer);
    if (el.tagName === "SELECT" || el.type === "checkbox" || ev.type === "change") update();  // at once
    else timer = setTimeout(update, TYPING_PAUSE_MS);
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
    lastChanged = null;
    update();
  }

  // the plan's options without its layout (and, to compare accelerators, without its accelerator)
  function searchBody(without = []) {
    const req = toRequest(readForm());
    if (req.error) { showError(req.error.field, req.error.rule); return null; }
    const body = req.body;
    delete body.timeline;
    delete body.explain;
    for (const k of ["tp", "pp", "dp", "cp", "ep", "zero", "mbs", "recompute", "recompute_layers", "schedule", "vpp", "sp",
                     ...without]) delete body[k];
    return body;
  }

  async function post(url, body, status) {
    $(status).textContent = t(url.endsWith("search") ? "searching" : "comparing");
    const res = await fetch(url, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
    const data = await res.json();
    if (!res.ok) { $(status).textContent = ""; clearErrors(); showError(data.field || "body", data.rule || res.statusText); return null; }
    return data;
  }

  async function findBest() {
    const body = searchBody();
    if (!body) return;
    body.top = 5;
    const data = await post("/api/search", body, "search-status");
    if (!data) return;
    lastSearch = data;
    View.searchRows(data, loadLayout);
    document.body.dataset.search = "ready";
  }

  async function compareAll() {
    const body = searchBody(["gpu"]);
    if (!body) return;
    body.compare_gpus = "all";
    body.objective = $("compare-objective").value;
    const data = await post("/api/compare", body, "compare-status");
    if (!data) return;
    lastCompare = data;
    View.compareRows(data, loadLayout, fieldLabel);
    document.body.dataset.compare = "ready";
  }

  // The run written for a framework: the target whose conventions the page plans under
  const TARGET_OF = { deepspeed: "deepspeed", megatron: "megatron", fsdp: "torchtitan" };
  function offerExport() {
    const fw = form.elements.framework.value, want = TARGET_OF[fw];
    for (const o of $("export-target").options) { o.disabled = o.value !== want; o.title = o.disabled ? t("export_other") : ""; }
    if (want) $("export-target").value = want;
    $("export").disabled = !want;
    const status = $("export-status");
    status.classList.remove("error");
    status.textContent = want ? "" : t("export_none", { framework: View.opt("framework", fw) });
  }

  async function exportRun() {
    const req = toRequest(readForm());
    const status = $("export-status");
    if (req.error) return;
    const body = { ...req.body, target: $("export-target").value };
    delete body.timeline;
    delete body.explain;
    const res = await fetch("/api/export", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
    const data = await res.json();
    if (!res.ok) {  // this plan is fine; the framework cannot write it: said beside the button
      const said = L10N.rule(data.rule || res.statusText);
      status.classList.add("error");
      status.textContent = t("field_rule", { field: fieldLabel(data.field || "target"), rule: said ?? data.rule });
      if (said === null) status.lang = "en"; else status.removeAttribute("lang");
      document.body.dataset.export = "error";
      return;
    }
    const link = document.createElement("a");
    link.href = URL.createObjectURL(new Blob([data.text], { type: "text/plain" }));
    link.download = data.filename;
    document.body.appendChild(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(link.href), 10000);
    status.classList.remove("error");
    status.removeAttribute("lang");
    status.textContent = t("export_done", { name: data.filename, n: L10N.num(data.text.length, 0),
      target: $("export-target").selectedOptions[0].textContent });
    document.body.dataset.export = "ready";
  }

  // An imported configuration's plan options as the page's inputs ([key, value] pairs)
  function importedParams(options) {
    const out = [];
    for (const [k, v] of Object.entries(options)) {
      if (k === "master_weights") { if (v === false) out.push(["no_master_weights", "true"]); continue; }
      if (k === "overlap_dp" && v === true) continue;  // the plan's default: gradients reduced during the backward
      if (k === "hf_config") { out.push([k, JSON.stringify(v)]); continue; }
      const el = form.elements[k];
      if (typeof v === "boolean" && !(el && el.type === "checkbox")) { if (v) out.push([k, "true"]); continue; }
      out.push([k, Array.isArray(v) ? v.join(",") : String(v)]);
    }
    return out;
  }

  let importName = "config";
  const FORMAT_NAMES = { megatron: "Megatron-LM", deepspeed: "DeepSpeed", torchtitan: "torchtitan" };
  async function importRun() {
    const status = $("import-status"), text = $("import-text").value;
    if (!text.trim()) return;
    const body = { text, name: importName };
    try { JSON.parse(text); body.model = form.elements.model.value; } catch (e) { /* not a DeepSpeed JSON */ }
    const res = await fetch("/api/import", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
    const data = await res.json();
    status.removeAttribute("lang");
    if (!res.ok) {
      const said = L10N.rule(data.rule || res.statusText);
      status.classList.add("error");
      status.textContent = t("field_rule", { field: fieldLabel(data.field || "text"), rule: said ?? data.rule });
      if (said === null) status.lang = "en";
      document.body.dataset.import = "error";
      return;
    }
    const gpu = form.elements.gpu.value;
    form.reset();
    for (const o of form.querySelectorAll("option[data-from-url]")) o.remove();
    if (!("gpu" in data.options)) form.elements.gpu.value = gpu;  // a config names no accelerator: the page's
    const params = importedParams(data.options);
    const missing = readUrl(params).filter(([kind]) => kind === "url_unknown_param").map(([, a]) => `${a.key} ${a.value}`);
    const lines = [t("import_done", { format: FORMAT_NAMES[data.format] || data.format, n: params.length - missing.length })];
    if (data.not_understood.length) lines.push(t("import_unknown", { list: data.not_understood.join(L10N.lang === "zh" ? "、" : ", ") }));
    if (missing.length) lines.push(t("import_missing", { list: missing.join(L10N.lang === "zh" ? "、" : ", ") }));
    status.classList.remove("error");
    status.textContent = lines.join(L10N.lang === "zh" ? "。" : ". ");
    document.body.dataset.import = "ready";
    lastChanged = null;
    showLinks();
    update();
  }

  // the accelerator's own links (and how many GPUs share one), shown where the plan gives none
  function showLinks() {
    const g = gpus.find((x) => x.name === form.elements.gpu.value);
    form.elements.scale_up_gbs.placeholder = g && g.scale_up_gbs ? String(g.scale_up_gbs) : "—";
    form.elements.nic_gbps.placeholder = g && g.nic_gbps ? String(g.nic_gbps) : "—";
    form.elements.gpus_per_node.placeholder = g ? String(g.scale_up_domain) : "8";
    form.elements.price.placeholder = g && g.price_usd_per_hour != null ? String(g.price_usd_per_hour) : "—";
  }

  async function init() {
    // an option's value is its own, whatever language its label is in
    for (const o of form.querySelectorAll("option:not([value])")) o.value = o.textContent;
    for (const [name, max] of [["tp", 64], ["pp", 128], ["cp", 32], ["ep", 128]])
      for (const v of POW2.filter((x) => x <= max)) form.elements[name].add(new Option(v, v));
    [models, gpus] = await Promise.all([fetch("/api/models").then((r) => r.json()), fetch("/api/gpus").then((r) => r.json())]);
    for (const m of models) $("model").add(new Option(m.name, m.name));
    for (const g of gpus) $("gpu").add(new Option(g.name, g.name));
    const given = [...query.keys()].some((k) => k !== "lang");
    for (const [k, v] of Object.entries(STARTER)) if (!given || k !== "zero") form.elements[k].value = v;
    readUrl();
    showLinks();
    if (matchMedia("(max-width: 900px)").matches) $("explain").open = false;  // folded on a phone: one tap opens it
    $("gpu").addEventListener("change", showLinks);
    form.addEventListener("input", changed);
    form.addEventListener("change", changed);
    $("lang").addEventListener("click", () => { L10N.lang = L10N.lang === "en" ? "zh" : "en"; applyLanguage(); writeUrl(readForm()); });
    $("find").addEventListener("click", findBest);
    $("compare").addEventListener("click", compareAll);
    $("export").addEventListener("click", exportRun);
    $("import").addEventListener("click", importRun);
    $("import-file").addEventListener("change", async (ev) => {
      const file = ev.target.files[0];
      if (!file) return;
      importName = file.name.replace(/[^\w.-]/g, "_").slice(-100) || "config";
      $("import-text").value = await file.text();
      $("import-name").textContent = file.name;
    });
    $("import-choose").addEventListener("click", () => $("import-file").click());
    $("import-text").addEventListener("input", () => { importName = "config"; $("import-name").textContent = ""; });
    $("compare-objective").addEventListener("change", () => { if (lastCompare) compareAll(); });
    applyLanguage();
    update();
  }
  init();
})();
