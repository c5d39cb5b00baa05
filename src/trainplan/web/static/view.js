// The explorer's readouts: the summary (verdict, peak stage's bar, speed), the resolved plan,
// memory bars of every stage, speed, timeline, whole run and hints, from one /api/plan answer.
const View = (() => {
  const $ = (id) => document.getElementById(id);
  const t = (k, v) => L10N.t(k, v);
  const GiB = 2 ** 30;
  const esc = (s) => String(s).replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" }[c]));
  const kv = (pairs) => pairs.map(([k, v]) => `<span>${esc(k)}${t("kv_sep")}<b>${esc(v)}</b></span>`).join("");
  // an option's words in the page's language (recompute "full", schedule "interleaved", ...)
  const opt = (name, value) => {
    const key = `opt_${name}_${String(value).replace(/-/g, "_")}`;
    return L10N.has(key) ? t(key) : String(value);
  };

  // params, grads, fp32 master, optimizer state, activations, logits + loss, buffers (other)
  const SEGS = [["params", (s) => s.params_bytes], ["grads", (s) => s.grads_bytes],
    ["master", (s) => s.components.master], ["optimizer", (s) => s.components.optimizer_state],
    ["activations", (s) => s.activations_bytes - s.components.activation_parts.head_and_loss],
    ["logits", (s) => s.components.activation_parts.head_and_loss], ["other", (s) => s.other_bytes]];
  const segName = (c) => t(c === "optimizer" ? "optimizer_state" : c);

  function bar(s, cap, scale) {
    const el = document.createElement("div");
    el.className = "bar";
    for (const [cls, value] of SEGS) {
      const seg = document.createElement("div");
      seg.className = "seg " + cls;
      seg.style.width = (100 * value(s) / scale) + "%";
      seg.title = `${segName(cls)}${t("kv_sep")}${L10N.gib(value(s))}`;
      el.appendChild(seg);
    }
    const capLine = document.createElement("div");
    capLine.className = "cap";
    capLine.style.left = (100 * cap / scale) + "%";
    el.appendChild(capLine);
    return el;
  }

  function summary(d) {
    const mem = d.memory, cap = mem.capacity_bytes, peak = mem.peak_bytes;
    const fit = $("fit");
    fit.className = "fit " + (mem.fits ? "ok" : "no");
    fit.dataset.fits = String(mem.fits);
    fit.dataset.peak = String(peak);
    const vars = { peak: L10N.num(peak / GiB), cap: L10N.num(cap / GiB, 0), stage: mem.peak_stage };
    fit.textContent = mem.fits ? t("fits", { ...vars, free: L10N.num((cap - peak) / GiB) })
      : t("no_fit", { ...vars, over: L10N.num((peak - cap) / GiB) });
    const worst = mem.stages.find((s) => s.stage === mem.peak_stage) || mem.stages[0];
    const holder = $("summary-bar");
    holder.replaceWith(Object.assign(bar(worst, cap, Math.max(cap, peak)), { id: "summary-bar" }));
    const tm = d.time;
    $("summary-speed").textContent = t("summary_speed", { step: L10N.dur(tm.step_s), tps: L10N.big(tm.tokens_per_s),
      mfu: L10N.pct(tm.mfu) });
  }

  function resolved(d) {
    const p = d.parallel, r = d.recipe;
    const vars = { tp: p.tp, pp: p.pp, dp: p.dp, cp: p.cp, ep: p.ep, zero: p.zero, sp: t(p.sp ? "sp_on" : "sp_off"),
      mbs: p.mbs, seq: L10N.num(p.seq_len, 0), gbs: L10N.num(p.gbs, 0), m: L10N.num(p.micro_batches, 0) };
    const box = $("resolved");
    box.dataset.layout = JSON.stringify({ tp: p.tp, pp: p.pp, dp: p.dp, cp: p.cp, ep: p.ep, zero: p.zero, sp: p.sp,
      mbs: p.mbs, seq_len: p.seq_len, gbs: p.gbs, micro_batches: p.micro_batches });
    const sched = opt("schedule", p.schedule) + (p.vpp > 1 ? ` v${p.vpp}` : "");
    box.innerHTML = [t("resolved_layout", vars), t(p.micro_batches === 1 ? "resolved_batch_one" : "resolved_batch", vars),
      t("resolved_recipe", { rc: opt("recompute", p.recompute), sched, precision: r.precision,
        optimizer: opt("optimizer", r.optimizer), framework: opt("framework", r.framework) })]
      .map((line) => `<div>${esc(line)}</div>`).join("");
  }

  function bars(d) {
    const mem = d.memory, cap = mem.capacity_bytes, scale = Math.max(cap, mem.peak_bytes);
    const box = $("bars");
    box.innerHTML = "";
    for (const s of mem.stages) {  // every stage: the list scrolls when long, none is skipped
      const row = document.createElement("div");
      row.className = "bar-row";
      row.dataset.stage = s.stage;
      row.dataset.total = String(s.total_bytes);
      const label = document.createElement("span");
      label.textContent = t("stage_row", { stage: s.stage, layers: s.layers });
      row.appendChild(label);
      row.appendChild(bar(s, cap, scale));
      const total = document.createElement("span");
      total.className = "total";
      total.textContent = `${L10N.num(s.total_bytes / GiB)} / ${L10N.num(cap / GiB, 0)} GiB`;
      row.appendChild(total);
      box.appendChild(row);
    }
    box.classList.toggle("long", mem.stages.length > 12);
    $("bars-scroll").hidden = mem.stages.length <= 12;
    $("bars-scroll").textContent = t("bars_scroll", { n: mem.stages.length });
    $("bars-note").textContent = t("bars_note", { stage: mem.peak_stage });
    const worst = mem.stages.find((s) => s.stage === mem.peak_stage) || mem.stages[0];
    // the peak stage's components in numbers, beside their colours (no hovering needed)
    $("legend").innerHTML = SEGS.map(([c, value]) =>
      `<span data-part="${c}" data-bytes="${value(worst)}"><i class="seg ${c}"></i>${esc(segName(c))} <b>${esc(L10N.gib(value(worst)))}</b></span>`).join("");
  }

  const COLOURS = { compute: "#4c9be8", tp_comm: "#e74c3c", pp_comm: "#f39c12", dp_comm: "#8e44ad",
    ep_comm: "#16a085", cp_comm: "#d35400", bubble: "#bdc3c7", optimizer: "#7f8c8d", data: "#2c3e50" };
  const partName = (k) => t(k === "optimizer" ? "optimizer_time" : k);

  function speed(d) {
    const mem = d.memory, tm = d.time;
    $("speed").dataset.step = String(tm.step_s);
    $("speed").innerHTML = kv([[t("step"), L10N.dur(tm.step_s)], [t("tokens_s"), L10N.big(tm.tokens_per_s)],
      [t("tflops"), L10N.num(tm.tflops_per_gpu, 0)], [t("mfu"), L10N.pct(tm.mfu) + (tm.mfu_peak === "fp8"
        ? " " + t("mfu_fp8", { bf16: L10N.pct(tm.mfu_bf16_peak) }) : "")], [t("bubble"), L10N.pct(tm.bubble_fraction)],
      [t("max_mbs"), mem.max_mbs > 0 ? String(mem.max_mbs) : t("max_mbs_none")]]);
    const total = Object.values(tm.breakdown_s).reduce((a, b) => a + b, 0) || 1;
    const parts = Object.entries(tm.breakdown_s).filter(([, v]) => v > 0);
    $("breakdown").innerHTML = parts.map(([k, v]) =>
      `<div style="width:${100 * v / total}%;background:${COLOURS[k] || "#999"}" title="${esc(partName(k))} ${L10N.pct(v / total)}"></div>`).join("");
    $("breakdown-legend").innerHTML = parts.filter(([, v]) => v > 0.005 * total).map(([k, v]) =>
      `<span data-part="${k}" data-seconds="${v}"><i style="background:${COLOURS[k] || "#999"}"></i>${esc(t("part_share", { name: partName(k), time: L10N.dur(v), share: L10N.pct(v / total) }))}</span>`).join("");
  }

  function run(d) {
    const tr = d.training;
    $("run").innerHTML = kv([[t("tokens"), L10N.big(tr.tokens)], [t("days"), L10N.num(tr.days, 1)],
      [t("gpu_hours"), L10N.big(tr.gpu_hours)], [t("cost"), tr.cost_usd == null ? "—" : "$" + L10N.big(tr.cost_usd)],
      [t("energy"), L10N.big(tr.energy_kwh) + " kWh"], [t("co2"), L10N.num(tr.co2_t, 1) + " t"], [t("goodput"), L10N.pct(tr.goodput)]]);
    $("run").dataset.cost = tr.cost_usd == null ? "" : String(tr.cost_usd);
    $("run").dataset.co2 = String(tr.co2_t);
  }

  function timeline(tl) {
    const box = $("timeline"), axis = $("timeline-axis");
    box.innerHTML = axis.innerHTML = "";
    $("timeline-legend").innerHTML = "";
    if (!tl) { $("timeline-note").textContent = t("timeline_none"); return; }
    $("timeline-note").textContent = t("timeline_note", { m: tl.micro_batches });
    const stages = Math.max(...tl.ops.map((o) => o[0])) + 1;
    box.classList.toggle("ranks", !!tl.rank_stages);  // wider labels: "rank 0: stages 0, 7"
    axis.classList.toggle("ranks", !!tl.rank_stages);
    const kinds = new Set();
    for (let s = 0; s < stages; s++) {  // every stage (the box scrolls)
      const row = document.createElement("div");
      row.className = "tl-row";
      const label = tl.rank_stages ? t("rank_label", { rank: s, stages: tl.rank_stages[s].join(t("list_sep")) })
        : t("stage_label", { stage: s });
      row.innerHTML = `<span class="lab" title="${esc(label)}">${esc(label)}</span>`;
      for (const [st, kind, mb, a, b] of tl.ops) {
        if (st !== s) continue;
        kinds.add(kind);
        const op = document.createElement("div");
        op.className = "tl-op " + kind;
        op.style.left = (100 * a / tl.step_s) + "%";
        op.style.width = Math.max(0.2, 100 * (b - a) / tl.step_s) + "%";
        op.title = `${t("tl_" + kind)} ${mb}`;
        if (100 * (b - a) / tl.step_s > 2.5) op.textContent = String(mb);
        row.appendChild(op);
      }
      box.appendChild(row);
    }
    $("timeline-wrap").classList.toggle("long", stages > 12);
    // the time axis: ticks over the simulated step
    const ticks = axis.clientWidth && axis.clientWidth < 480 ? [0, 0.5, 1] : [0, 0.25, 0.5, 0.75, 1];  // phones: fewer
    axis.innerHTML = `<span class="axis-title">${esc(t("timeline_axis"))}</span>` + ticks.map((f) =>
      `<span class="tick" style="left:${100 * f}%">${esc(L10N.dur(f * tl.step_s))}</span>`).join("");
    $("timeline-legend").innerHTML = ["F", "B", "I", "W"].filter((k) => kinds.has(k)).map((k) =>
      `<span data-kind="${k}"><i class="tl-op ${k}"></i>${esc(t("tl_" + k))}</span>`).join("");
  }

  function hints(d, overlapTicked) {
    const out = [], p = d.parallel, mem = d.memory, tm = d.time;
    // the plan's own warnings first, in the page's language (the TP-across-nodes one is the first hint below)
    for (const w of d.warning_details || []) {
      if (w.code === "tp_across_nodes") continue;
      const key = "warn_" + w.code;
      // option values among the parameters in the page's words (recompute "none")
      const params = Object.fromEntries(Object.entries(w.params || {}).map(([k, v]) => [k, opt(k, v)]));
      out.push("⚠️ " + esc(L10N.has(key) ? t(key, params) : w.message));
    }
    if (p.tp > d.gpu.gpus_per_node) out.push(t("hint_tp_nvlink", { tp: p.tp, gpn: d.gpu.gpus_per_node }));
    if (tm.bubble_fraction > 0.1) out.push(t("hint_bubble", { bubble: L10N.pct(tm.bubble_fraction) }));
    if (!mem.fits) out.push(t("hint_no_fit"));
    const worst = mem.stages.reduce((a, b) => (b.total_bytes > a.total_bytes ? b : a));
    if (worst.activations_bytes > 0.4 * worst.total_bytes && p.recompute === "none")
      out.push(t("hint_recompute", { share: L10N.pct(worst.activations_bytes / worst.total_bytes) }));
    if (p.zero === 0 && p.dp > 1)
      out.push(d.recipe.framework.startsWith("fsdp") ? t("hint_zero_fsdp") : t("hint_zero", { zero: 1 }));
    const comm = Object.entries(tm.breakdown_s).filter(([k]) => k.endsWith("_comm")).sort((a, b) => b[1] - a[1])[0];
    if (comm && comm[1] > 0.15 * tm.step_s) {
      const share = L10N.pct(comm[1] / tm.step_s);
      out.push(comm[0] === "tp_comm" && !overlapTicked ? t("hint_tp_overlap", { share }) : t("hint_tp_bound", { what: t(comm[0]), share }));
    }
    if (!out.length) out.push(t("hint_fine"));
    $("hints").innerHTML = out.map((h) => `<li>${h}</li>`).join("");
  }

  // How far to trust the step time: the error on published runs, linked to docs/accuracy.md
  function accuracy(a, gpu) {
    const box = $("accuracy");
    if (!a) { box.textContent = ""; return; }
    const beyond = (a.beyond || []).length ? " " + t("acc_beyond", { what: a.beyond.map((b) => t("acc_beyond_" + b)).join(" / ") }) : "";
    const moe = a.moe_plan && a.moe_runs && !(a.beyond || []).includes("moe") ? " " + t("acc_moe_runs", { n: a.moe_runs }) : "";
    let basis;
    if (a.basis === "profile") basis = t("acc_profile");
    else if (a.compared_on === null) basis = t("acc_none", { gpu });
    else {
      const fitted = a.fitted_runs ? t("acc_fitted", { n: a.fitted_runs }) : "";
      const vars = { runs: a.runs, fitted, on: a.compared_on, gpu, mean: L10N.pct(a.mean_abs_error), worst: L10N.pct(a.worst_abs_error) };
      basis = t(a.compared_on === gpu ? "acc_runs" : "acc_shared", vars);
    }
    box.innerHTML = esc(basis + moe + beyond).replace("docs/accuracy.md",
      '<a href="/docs/accuracy.md" target="_blank" rel="noopener">docs/accuracy.md</a>');
  }

  function render(d, overlapTicked) {
    summary(d);
    resolved(d);
    bars(d);
    speed(d);
    accuracy(d.time.accuracy, d.gpu.name);
    timeline(d.timeline);
    run(d);
    Explain.optimizer = opt("optimizer", d.recipe.optimizer);
    Explain.schedule = (x) => opt("schedule", x);
    Explain.render(d.explain);
    hints(d, overlapTicked);
  }

  function searchRows(data, load) {
    $("search-status").textContent = t("search_done", { n: L10N.num(data.evaluated, 0), fit: L10N.num(data.feasible, 0),
      gbs: L10N.num(data.gbs, 0) });
    const list = $("search-results");
    list.innerHTML = "";
    for (const b of data.best) {
      const p = b.parallel;
      const a = document.createElement("a");
      a.href = "#";
      a.className = "search-result";
      const zero = p.zero + (p.zero >= 1 && p.dp_shard < p.dp ? t("search_shard", { n: p.dp_shard }) : "");
      a.textContent = t("search_row", { tp: p.tp, pp: p.pp, dp: p.dp, cp: p.cp, zero, mbs: p.mbs,
        rc: opt("recompute", p.recompute), sched: opt("schedule", p.schedule) + (p.vpp > 1 ? " v" + p.vpp : ""),
        step: L10N.dur(b.time.step_s), mfu: L10N.pct(b.time.mfu), peak: L10N.num(b.memory.peak_bytes / GiB) });
      a.addEventListener("click", (ev) => { ev.preventDefault(); load(p); });
      list.appendChild(document.createElement("li")).appendChild(a);
    }
  }

  function compareRows(data, load, fieldName) {
    const first = data.rows.find((x) => x.best);
    const par = first ? first.best.parallel : null;
    $("compare-status").textContent = par ? t("compare_done", { gpus: L10N.num(first.best.gpu.gpus, 0),
      gbs: L10N.num(par.gbs, 0), seq: L10N.num(par.seq_len, 0), rank: t("rank_" + data.objective) }) : "";
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
      const layout = `TP ${p.tp} · PP ${p.pp} · DP ${p.dp} · CP ${p.cp} · ZeRO ${p.zero} · ${opt("recompute", p.recompute)}`;
      const cost = b.training.cost_usd === null ? "—" : "$" + L10N.big(b.training.cost_usd);
      const error = acc.compared_on ? `${L10N.pct(acc.mean_abs_error)} (${acc.runs})` : t("compare_error_none");
      for (const cell of [r.gpu, layout, L10N.big(b.time.tokens_per_s), L10N.pct(b.time.mfu), L10N.num(b.training.days, 1), cost, error])
        row.insertCell().textContent = cell;
      row.addEventListener("click", () => load(p, r.gpu));
    }
    const skipped = $("compare-skipped");
    skipped.innerHTML = "";
    for (const r of data.rows.filter((x) => !x.best)) {
      const cut = r.reason.indexOf(": ");
      const field = cut > 0 ? r.reason.slice(0, cut) : "";
      const rule = cut > 0 ? r.reason.slice(cut + 2) : r.reason;
      const li = skipped.appendChild(document.createElement("li"));
      li.dataset.gpu = r.gpu;
      li.dataset.field = field;
      const said = L10N.rule(rule);
      li.textContent = t("compare_skip", { gpu: r.gpu, field: fieldName(field), rule: said ?? rule });
      if (said === null) li.lang = "en";
    }
  }

  return { render, searchRows, compareRows, opt, esc };
})();
