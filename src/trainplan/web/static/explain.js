// The "why" panel: the peak stage's memory formula and the step's parts with the plan's numbers
// filled in (what `trainplan plan --explain` prints), from the answer's "explain" key.
const Explain = (() => {
  const t = (k, v) => L10N.t(k, v);
  const g = (x) => L10N.gib(x);
  const d = (s) => L10N.dur(s);
  const esc = (s) => String(s).replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" }[c]));
  const term = (prefix, k) => (L10N.has(prefix + k) ? t(prefix + k) : k.replace(/_/g, " "));
  const sum = (parts) => parts.filter(([, v]) => v).map(([k, v]) => `${k} ${v}`).join(" + ");

  function memoryLines(m) {
    const b = m.bytes_per_param, full = m.finetune === "full";
    const shard = (on) => (on && m.shard > 1 ? t("ex_shard", { n: m.shard, zero: m.zero }) : "");
    const X = full ? "P" : "T";
    const out = [[t("explain_memory", { stage: m.stage, stages: m.stages, layers: m.layers }), "head"],
      [t("ex_params", { P: L10N.num(m.params, 0) }), "params"]];
    if (!full) out.push([t("ex_trainable", { T: L10N.num(m.trainable, 0) }), "trainable"]);
    out.push([t("ex_weights", { b: b.weights, shard: shard(m.sharded.weights), v: g(m.weights_bytes) }), "weights"]);
    out.push([t("ex_grads", { X, b: b.grads, shard: shard(m.sharded.grads), v: g(m.grads_bytes) }), "grads"]);
    out.push([t("ex_optimizer", { X, m: b.master, o: b.optimizer, opt: Explain.optimizer || "", shard: shard(m.sharded.optimizer),
      v: g(m.optimizer_bytes) }) + (m.offload_optimizer ? t("ex_offloaded") : ""), "optimizer"]);
    if (full) {
      const per = b.weights + b.grads + b.master + b.optimizer;
      out.push([t("ex_per_param", { sum: per, parts: [b.weights, b.grads, b.master, b.optimizer].join(" + ") }), "per-param"]);
    }
    for (const layer of m.activation_layers) {
      out.push([t("ex_act_layer", { kind: t("kind_" + layer.kind), mbs: m.mbs, seq: L10N.num(m.seq_len, 0),
        tokens: L10N.num(m.tokens_per_rank, 0), v: g(layer.per_layer_bytes) }), "layer"]);
      out.push([Object.entries(layer.terms).map(([k, v]) => `${term("act_", k)} ${g(v)}`).join(t("list_sep")), "terms"]);
    }
    const every = m.activation_layers.reduce((a, l) => a + l.count * l.per_layer_bytes, 0);
    const perMb = m.layers_per_micro_batch_bytes;
    const layersTerm = Math.abs(every - perMb) <= 1e-9 * Math.max(perMb, 1)
      ? m.activation_layers.map((l) => t("ex_layers_term", { n: l.count, kind: t("kind_" + l.kind), per: g(l.per_layer_bytes) })).join(" + ")
      : t("ex_layers_kept", { v: g(perMb) });
    const extra = Object.entries(m.activation_parts).filter(([k]) => k !== "layers").reduce((a, [, v]) => a + v, 0);
    out.push([t("ex_act", { layers: layersTerm, flight: L10N.num(m.in_flight, m.in_flight % 1 ? 2 : 0),
      sched: Explain.schedule(m.schedule), m: m.micro_batches, extra: g(extra), v: g(m.activations_bytes) }), "activations"]);
    out.push([t("ex_other", { parts: sum(Object.entries(m.other).map(([k, v]) => [term("other_", k), v ? g(v) : 0])),
      v: g(Object.values(m.other).reduce((a, x) => a + x, 0)) }), "other"]);
    out.push([t("ex_total", { v: g(m.total_bytes), cap: g(m.capacity_bytes) }), "total"]);
    return out;
  }

  function timeLines(tm) {
    const out = [[t("explain_time", { stage: tm.stage, stages: tm.stages }), "head"]];
    for (const l of tm.layers) {
      out.push([t("ex_layer_time", { kind: t("kind_" + l.kind), gf: d(l.gemm_forward), gb: d(l.gemm_backward),
        af: d(l.attention_forward), ab: d(l.attention_backward), ef: d(l.elementwise_forward), eb: d(l.elementwise_backward),
        rc: d(l.recompute), t: d(l.total), n: l.count, tt: d(l.total * l.count) }), "layer-time"]);
    }
    for (const [k, v] of Object.entries(tm.comm_per_layer_s || {}))  // what each parallelism costs a layer
      out.push([t("ex_comm", { what: t(k), per: d(v), n: tm.stage_layers, v: d(v * tm.stage_layers) }), "comm-" + k]);
    const ends = [tm.head_s ? t("ex_head_time", { h: d(tm.head_s) }) : "", tm.embedding_s ? t("ex_embedding_time", { e: d(tm.embedding_s) }) : ""];
    if (ends.some(Boolean)) out.push([ends.filter(Boolean).join(t("list_sep")), "ends"]);
    const mb = Object.entries(tm.micro_batch_s);
    out.push([t("ex_micro", { parts: sum(mb.map(([k, v]) => [t(k), v ? d(v) : 0])), v: d(mb.reduce((a, [, v]) => a + v, 0)) }), "micro"]);
    const bd = tm.breakdown_s;
    const pipeline = bd.compute + bd.tp_comm + bd.ep_comm + bd.cp_comm + bd.pp_comm + bd.bubble;
    out.push([t("ex_pipeline", { m: tm.micro_batches, sched: Explain.schedule(tm.schedule) + (tm.vpp > 1 ? ` v${tm.vpp}` : ""),
      pp: tm.stages, v: d(pipeline), b: d(bd.bubble) }), "pipeline"]);
    out.push([t("ex_step", { p: d(pipeline), n: tm.dp_ranks, dp: d(bd.dp_comm), o: d(bd.optimizer), data: d(bd.data),
      step: d(tm.step_s) }), "step"]);
    return out;
  }

  function render(x) {
    const box = document.getElementById("explain-body");
    if (!x) { box.innerHTML = ""; return; }
    const lines = [...memoryLines(x.memory), ...timeLines(x.time)];
    box.innerHTML = lines.map(([text, kind]) => `<div class="ex ${kind}" data-line="${kind}">${esc(text)}</div>`).join("");
  }

  return { render, optimizer: "", schedule: (s) => s };
})();
