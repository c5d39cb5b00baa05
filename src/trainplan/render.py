"""Human-readable tables for the CLI (rich). Bytes are shown in GiB (2**30), labelled."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from .units import GiB, fmt_count

BAR_WIDTH = 30
# Bar segments: (JSON stage key, glyph, colour)
SEGMENTS = (("params_bytes", "█", "cyan"), ("grads_bytes", "█", "blue"),
            ("optimizer_bytes", "█", "magenta"), ("activations_bytes", "█", "yellow"),
            ("other_bytes", "█", "bright_black"))


def _console(width: int = 140) -> Console:
    return Console(highlight=False, soft_wrap=False, width=width)


def _gib(x: float) -> str:
    return f"{x / GiB:,.2f}"


def memory_bar(stage: dict, capacity: float) -> Text:
    """A bar of BAR_WIDTH cells = capacity; segments per component; '!' past capacity."""
    scale = BAR_WIDTH / capacity
    bar = Text()
    used = 0
    for key, glyph, colour in SEGMENTS:
        cells = round(stage[key] * scale)
        cells = max(0, min(cells, BAR_WIDTH - used))
        bar.append(glyph * cells, style=colour)
        used += cells
    if stage["total_bytes"] > capacity:
        bar.append("!", style="bold red")
    else:
        bar.append("░" * (BAR_WIDTH - used), style="bright_black")
        bar.append("|")
    return bar


def _links(g: dict) -> str:
    """The links a plan's collectives cross: inside a node, and between nodes."""
    inside = min(g["gpus"], g["gpus_per_node"]) > 1
    across = g["gpus"] > g["gpus_per_node"]
    return ((f", scale-up {g['scale_up_gbs']:g} GB/s" if inside else "")
            + (f", network {g['nic_gbps']:g} Gb/s per GPU" if across else ""))


def render_plan(data: dict) -> None:
    c = _console()
    m, par, g, tr, mem = data["model"], data["parallel"], data["gpu"], data["recipe"], data["memory"]
    c.print(f"[bold]{m['name']}[/] — {fmt_count(m['params'])} parameters"
            + (f" ({fmt_count(m['active_params'])} active)" if m["active_params"] != m["params"] else "")
            + f", {m['layers']} layers, hidden {m['hidden']}")
    c.print(f"{g['gpus']} x {g['name']} ({g['memory_gib']:g} GiB), {g['gpus_per_node']} per node{_links(g)}")
    c.print(f"TP {par['tp']} · PP {par['pp']} · DP {par['dp']} · CP {par['cp']}"
            f"{' (' + par['cp_comm'] + ')' if par['cp'] > 1 else ''} · EP {par['ep']} · "
            f"ZeRO-{par['zero']}"
            f"{' sharded over ' + str(par['dp_shard']) + ' of DP (HSDP)' if par['zero'] >= 1 and par['dp_shard'] < par['dp'] else ''}"
            f"{' (backward prefetch ' + par['backward_prefetch'] + ')' if par['zero'] >= 3 and par.get('backward_prefetch', 'pre') != 'pre' else ''}"
            f"{' · SP' if par['sp'] else ''}")
    c.print(f"micro-batch {par['mbs']} x seq {par['seq_len']}, global batch {par['gbs']} "
            f"({par['micro_batches']} micro-batch{'es' if par['micro_batches'] != 1 else ''} per step), recompute {par['recompute']}"
            f"{' (' + ', '.join(par['recompute_modules']) + ')' if par.get('recompute_modules') else ''}"
            f"{' (the first ' + str(par['recompute_layers']) + ' layers of each ' + ('virtual stage' if par['vpp'] > 1 else 'stage') + ')' if par.get('recompute_layers') is not None else ''}"
            f"{' (early stop)' if par.get('recompute_early_stop') else ''}, "
            f"schedule {par['schedule']}{' v=' + str(par['vpp']) if par['vpp'] > 1 else ''}"
            f"{' N=' + str(par['pp_group']) if par.get('pp_group') else ''}")
    bpp = tr["bytes_per_param"]
    c.print(f"{tr['precision']} · {tr['optimizer']} ({tr['optimizer_impl']}) · {tr['framework']} conventions "
            f"({bpp['weights']:g}+{bpp['grads']:g}+{bpp['master']:g}+{bpp['optimizer']:g} bytes/param) · "
            f"attention {tr['attention']}" + (" · fused loss" if tr["fused_loss"] else "")
            + (f" · gradients reduced in {tr['reduce_dtype']}" if tr.get("reduce_dtype") else "")
            + (" · fused norm/SwiGLU" if tr.get("fused_kernels") and tr["framework"] != "megatron" else "")
            + (f" · {tr['finetune']} r={tr['lora_rank']}" if tr["finetune"] != "full" else ""))
    t = Table(title="Per-GPU memory by pipeline stage (GiB)", title_justify="left")
    for col in ("stage", "layers", "params", "grads", "optimizer", "activations", "other", "total"):
        t.add_column(col, justify="right")
    t.add_column(f"0 … {mem['capacity_bytes'] / GiB:g} GiB", no_wrap=True)
    stages = mem["stages"]
    shown = stages if len(stages) <= 12 else stages[:5] + [None] + stages[-5:]
    for s in shown:
        if s is None:
            t.add_row("…", "", "", "", "", "", "", "", "")
            continue
        t.add_row(str(s["stage"]), str(s["layers"]), _gib(s["params_bytes"]), _gib(s["grads_bytes"]),
                  _gib(s["optimizer_bytes"]), _gib(s["activations_bytes"]), _gib(s["other_bytes"]),
                  _gib(s["total_bytes"]), memory_bar(s, mem["capacity_bytes"]))
    c.print(t)
    legend = Text("  ")
    for (_key, glyph, colour), name in zip(SEGMENTS, ("params", "grads", "optimizer", "activations", "other"), strict=True):
        legend.append(glyph, style=colour)
        legend.append(f" {name}  ")
    c.print(legend)
    peak, cap = mem["peak_bytes"], mem["capacity_bytes"]
    if mem["fits"]:
        c.print(f"[bold green]✅ fits[/]: peak {_gib(peak)} GiB on stage {mem['peak_stage']} of "
                f"{_gib(cap)} GiB, headroom {_gib(cap - peak)} GiB")
    else:
        c.print(f"[bold red]❌ does not fit[/]: peak {_gib(peak)} GiB on stage {mem['peak_stage']} "
                f"exceeds {_gib(cap)} GiB by {_gib(peak - cap)} GiB")
    if "max_mbs" in mem:
        c.print(f"largest micro-batch that fits: {mem['max_mbs'] or 'none (even 1 does not fit)'}")
    if "time" in data:
        render_time(c, data)
    for w in data["warnings"]:
        c.print(f"[yellow]warning[/]: {w}")


def render_models(rows: list[dict]) -> None:
    t = Table(title="Model catalog")
    for col in ("name", "family", "params", "active", "layers", "hidden", "heads/kv", "vocab", "experts"):
        t.add_column(col, justify="left" if col in ("name", "family") else "right")
    for r in rows:
        t.add_row(r["name"], r["family"], fmt_count(r["params"]), fmt_count(r["active_params"]),
                  str(r["layers"]), str(r["hidden"]), f"{r['heads']}/{r['kv_heads']}", str(r["vocab"]),
                  str(r["experts"] or ""))
    _console().print(t)


def render_gpus(rows: list[dict]) -> None:
    t = Table(title="Accelerator catalog (dense TFLOP/s)")
    for col in ("name", "memory GiB", "HBM TB/s", "bf16", "fp16", "fp8", "fp32", "scale-up GB/s", "GPUs on it",
                "NIC Gb/s", "TDP W", "$/h", "time error"):
        t.add_column(col, justify="left" if col == "name" else "right")
    for r in rows:
        pk, acc = r["peak_tflops"], r.get("accuracy") or {}
        t.add_row(r["name"], f"{r['memory_gib']:g}", f"{r['hbm_tbs']:g}",
                  *(f"{pk[k]:g}" if k in pk else "—" for k in ("bf16", "fp16", "fp8", "fp32")),
                  f"{r['scale_up_gbs']:g}" if r["scale_up_gbs"] else "—", f"{r['scale_up_domain']:,}",
                  f"{r['nic_gbps']:g}" if r["nic_gbps"] else "—", f"{r['tdp_w']:g}",
                  f"{r['price_usd_per_hour']:.2f}" if r["price_usd_per_hour"] is not None else "—",
                  _error_cell(acc))
    c = _console()
    c.print(t)
    c.print("time error: mean absolute error of the predicted speed on published runs (their number), on that "
            "accelerator or one whose efficiency defaults it shares (docs/accuracy.md); — for a link: none in the "
            "catalog, a plan crossing it gives its own (--scale-up-gbs, --nic-gbps)")


def _error_cell(acc: dict) -> str:
    """The time model's mean error on an accelerator's published runs (their number), "profile"
    where a measured profile prices it, or — for none."""
    if acc.get("basis") == "profile":
        return "profile"
    return f"{acc['mean_abs_error']:.1%} ({acc['runs']})" if acc.get("compared_on") else "—"


def render_validation(data: dict) -> None:
    """Predicted vs measured per term, one table per case."""
    c = _console()
    labels = {"params_bytes": "parameters", "grads_bytes": "gradients", "optimizer_bytes": "optimizer state",
              "activations_bytes": "activations (saved for backward)", "flops": "FLOPs (fwd + bwd)"}
    for case in data["cases"]:
        t = Table(title=case["name"], title_justify="left")
        for col in ("term", "predicted", "measured", "error"):
            t.add_column(col, justify="left" if col == "term" else "right")
        for key, label in labels.items():
            p, m = case["predicted"].get(key), case["measured"].get(key)
            err = case["rel_error"].get(key)
            unit = (lambda x: f"{x / 1e9:,.3f} G") if key == "flops" else (lambda x: f"{x / 2**20:,.2f} MiB")
            t.add_row(label, unit(p) if p is not None else "—", unit(m) if m is not None else "—",
                      f"{err * 100:+.2f}%" if err is not None else "—")
        c.print(t)
        for note in case.get("notes", []):
            c.print(f"  note: {note}")
        for key in ("peak_allocated_bytes", "step_s"):
            if key in case:
                c.print(f"  {key}: {case[key]}")
    c.print(f"largest |error| over all terms: {data['max_abs_rel_error'] * 100:.2f}% (device: {data['device']})")


def _dur(seconds: float) -> str:
    if seconds >= 86400:
        return f"{seconds / 86400:,.1f} days"
    if seconds >= 3600:
        return f"{seconds / 3600:,.1f} h"
    if seconds >= 1:
        return f"{seconds:,.2f} s"
    return f"{seconds * 1e3:,.1f} ms"


def accuracy_sentence(a: dict, gpu: str) -> str:
    """How far the step time is to be trusted, in words (estimate/accuracy.py)."""
    names = {"moe": "mixture of experts", "lora": "LoRA fine-tuning", "qlora": "QLoRA fine-tuning"}
    beyond = (f"; the published runs are dense models trained in full, not {' or '.join(names[b] for b in a['beyond'])}"
              if a.get("beyond") else "")
    moe = a.get("moe_runs")
    experts = (f"; {moe} of them {'a mixture' if moe == 1 else 'mixtures'} of experts"
               if moe and a.get("moe_plan") and "moe" not in a.get("beyond", []) else "")
    return _accuracy_basis(a, gpu) + experts + beyond


def _accuracy_basis(a: dict, gpu: str) -> str:
    if a["basis"] == "profile":
        return "accuracy: priced from a measured profile (docs/accuracy.md compares the catalog defaults)"
    if a["compared_on"] is None:
        return (f"accuracy: no published run on {gpu} compared yet; its efficiencies are catalog defaults "
                "(measure them: trainplan bench --profile)")
    shares = "" if a["compared_on"] == gpu else f", whose efficiency defaults {gpu} shares,"
    fitted = f" ({a['fitted_runs']} fitted on)" if a.get("fitted_runs") else ""
    return (f"accuracy: {a['runs']} published runs{fitted} on {a['compared_on']}{shares} predicted with "
            f"{a['mean_abs_error']:.1%} mean error, {a['worst_abs_error']:.1%} worst (docs/accuracy.md)")


def mfu_peak(t: dict) -> str:
    """Which peak the MFU divides by, where the plan's GEMMs run in fp8 (with its MFU against
    the bf16 peak beside it); nothing for a 16-bit plan."""
    if t.get("mfu_peak") != "fp8":
        return ""
    bf16 = f", {t['mfu_bf16_peak']:.1%} of the bf16 peak" if t.get("mfu_bf16_peak") is not None else ""
    return f" of the fp8 peak{bf16}"


def _mfu_cell(t: dict) -> str:
    """A table's MFU, marked where it divides by the fp8 peak."""
    return f"{t['mfu']:.1%}" + (" of fp8" if t.get("mfu_peak") == "fp8" else "")


def render_time(c: Console, data: dict) -> None:
    t, tr = data["time"], data["training"]
    c.print(f"[bold]step[/] {_dur(t['step_s'])} · {t['tokens_per_s']:,.0f} tokens/s · "
            f"{t['tflops_per_gpu']:,.0f} TFLOP/s per GPU · MFU {t['mfu']:.1%} (HFU {t['hfu']:.1%}){mfu_peak(t)} · "
            f"bubble {t['bubble_fraction']:.1%} · {t['bottleneck']}")
    if "accuracy" in t:
        c.print("  " + accuracy_sentence(t["accuracy"], data["gpu"]["name"]))
    b = t["breakdown_s"]
    total = sum(b.values()) or 1.0
    c.print("  where the step goes: " + ", ".join(f"{k.replace('_', ' ')} {v / total:.0%}"
                                                  for k, v in b.items() if v > 0.005 * total))
    par = data["parallel"]
    if not par.get("gbs_given", True) and t["bubble_fraction"] > 0.05:
        from .search import search_batch, search_batch_tokens

        batch = search_batch(par["seq_len"], data["gpu"]["gpus"])
        c.print(f"  the default global batch ({par['gbs']:,}, {par['micro_batches']} micro-batches) leaves a "
                f"{t['bubble_fraction']:.0%} bubble: a training batch of about {search_batch_tokens(data['gpu']['gpus'])} tokens "
                f"(--gbs {batch}) amortizes it")
    inp = t.get("input_pipeline_s")
    if inp and b.get("data", 0) > 0:
        stages = ", ".join(f"{k.replace('_', ' ')} {inp[k] * 1e3:.3g} ms"
                           for k in ("storage", "tokenize", "host_to_device") if inp[k] > 0)
        c.print(f"  input pipeline per step and data-parallel rank: {stages} "
                f"({'prefetched: the slowest stage sets the pace' if inp['prefetch'] else 'serial: the stages add up'})")
    cost = f"${tr['cost_usd']:,.0f}" if tr["cost_usd"] is not None else "price unknown (--price)"
    c.print(f"[bold]training[/] {tr['tokens'] / 1e9:,.0f}B tokens · {tr['steps']:,.0f} steps · "
            f"{tr['days']:,.1f} days · {tr['gpu_hours']:,.0f} GPU-hours · {cost} · "
            f"{tr['energy_kwh']:,.0f} kWh · {tr['co2_t']:,.1f} t CO2 · goodput {tr['goodput']:.1%}")


def render_search(data: dict) -> None:
    c = _console(200)
    seq = data["best"][0]["parallel"]["seq_len"] if data["best"] else 0
    batch = (f"global batch {data['gbs']:,} x {seq:,} tokens"
             + ("" if data["gbs_given"] else f" ({data['gbs'] * seq / 1e6:.1f}M tokens, the default; --gbs sets it)"))
    c.print(f"evaluated {data['evaluated']:,} layouts in {data['seconds']:.2f} s; {data['feasible']:,} fit; "
            f"{batch}; best by {data['objective']}:")
    t = Table()
    for col in ("#", "TP", "SP", "PP", "DP", "CP", "EP", "ZeRO", "mbs", "recompute", "schedule", "step", "tokens/s",
                "MFU", "peak GiB", "headroom", "bottleneck", "$/M tok"):
        t.add_column(col, justify="right", no_wrap=True)
    for i, b in enumerate(data["best"], 1):
        p, tm, mem, tr = b["parallel"], b["time"], b["memory"], b["training"]
        sched = {"interleaved": "interl."}.get(p["schedule"], p["schedule"]) + (f" v{p['vpp']}" if p["vpp"] > 1 else "")
        per_m = (tr["cost_usd"] / tr["tokens"] * 1e6) if tr["cost_usd"] else None
        # hybrid sharding: ZeRO over groups of dp_shard data-parallel ranks
        zero = str(p["zero"]) + (f" (shard {p['dp_shard']})" if p["zero"] >= 1 and p["dp_shard"] < p["dp"] else "")
        t.add_row(str(i), str(p["tp"]), "on" if p["sp"] else "", str(p["pp"]), str(p["dp"]), str(p["cp"]), str(p["ep"]), zero,
                  str(p["mbs"]), p["recompute"], sched, _dur(tm["step_s"]), f"{tm['tokens_per_s']:,.0f}",
                  _mfu_cell(tm), f"{mem['peak_bytes'] / GiB:.1f}", f"{mem['headroom_bytes'] / GiB:.1f}",
                  tm["bottleneck"], f"{per_m:.3f}" if per_m is not None else "—")
    c.print(t)
    if data["best"] and "accuracy" in data["best"][0]["time"]:
        c.print(accuracy_sentence(data["best"][0]["time"]["accuracy"], data["best"][0]["gpu"]["name"]))


def _layout_brief(p: dict) -> str:
    sched = "" if p["pp"] == 1 else " " + p["schedule"] + (f" v{p['vpp']}" if p["vpp"] > 1 else "")
    dims = " ".join(f"{k.upper()}{p[k]}" + (" SP" if k == "tp" and p["sp"] else "")
                    for k in ("tp", "pp", "dp", "cp", "ep") if p[k] > 1 or k == "dp")
    return f"{dims} ZeRO-{p['zero']} mbs {p['mbs']}{' ' + p['recompute'] if p['recompute'] != 'none' else ''}{sched}"


def render_gpu_comparison(data: dict) -> None:
    """`search --compare-gpus`: the best layout on each accelerator, ranked."""
    c = _console(200)
    deadline = data["deadline_days"]
    ranked = {"time": "most tokens per second", "cost": "lowest cost"}[data["objective"]]
    if deadline is not None and data["objective"] == "time":
        ranked = "fewest GPUs, then fewest days"
    what = (f"the fewest GPUs of each that train within {deadline:g} days" if deadline is not None
            else "the best layout on each")
    c.print(f"the same training on {len(data['rows'])} accelerators, {what}; ranked by {ranked}:")
    t = Table()
    for col in ("#", "accelerator", "GPUs", "layout", "step", "tokens/s", "per GPU", "MFU", "peak GiB", "days",
                "cost", "$/M tok", "kWh", "time error"):
        t.add_column(col, justify="left" if col in ("accelerator", "layout") else "right", no_wrap=True)
    shown = [r for r in data["rows"] if r["best"]]
    for i, r in enumerate(shown, 1):
        b = r["best"]
        tm, tr, g = b["time"], b["training"], b["gpu"]
        cost = tr["cost_usd"]
        t.add_row(str(i), r["gpu"], f"{g['gpus']:,}", _layout_brief(b["parallel"]), _dur(tm["step_s"]),
                  f"{tm['tokens_per_s']:,.0f}", f"{tm['tokens_per_s'] / g['gpus']:,.0f}", _mfu_cell(tm),
                  f"{b['memory']['peak_bytes'] / GiB:.1f}", f"{tr['days']:,.1f}",
                  f"${cost:,.0f}" if cost is not None else "—",
                  f"{cost / tr['tokens'] * 1e6:.3f}" if cost is not None else "—",
                  f"{tr['energy_kwh']:,.0f}", _error_cell(tm.get("accuracy") or {}))
    if shown:
        c.print(t)
        tr, par = shown[0]["best"]["training"], shown[0]["best"]["parallel"]
        price = (f"${data['price']:g} per GPU-hour for all (--price)" if data["price"] is not None
                 else "each accelerator's catalog price per GPU-hour (--price sets one for all)")
        c.print(f"training {tr['tokens'] / 1e9:,.0f}B tokens in global batches of {par['gbs']:,} x {par['seq_len']:,} "
                f"(--gbs); cost at {price}")
        c.print("time error: the time model's mean error on the published runs on that accelerator (how many), "
                "— where none is compared yet")
    for r in data["rows"]:
        if not r["best"]:
            c.print(f"[yellow]{r['gpu']}[/]: {r['reason']}")


def render_pareto(data: dict) -> None:
    c = _console(160)
    c.print(f"memory vs throughput: {len(data['front'])} layouts on the front of {data['feasible']:,} that fit "
            f"({data['evaluated']:,} evaluated), each training a global batch of {data['gbs']:,} sequences"
            + ("" if data["gbs_given"] else " (the default; --gbs sets it)"))
    t = Table()
    for col in ("peak GiB", "tokens/s", "TP", "PP", "CP", "EP", "ZeRO", "mbs", "recompute", "schedule"):
        t.add_column(col, justify="right", no_wrap=True)
    for pt in data["front"]:
        p = pt["parallel"]
        t.add_row(f"{pt['peak_bytes'] / GiB:.1f}", f"{pt['tokens_per_s']:,.0f}", str(p["tp"]), str(p["pp"]),
                  str(p["cp"]), str(p["ep"]), str(p["zero"]), str(p["mbs"]), p["recompute"],
                  p["schedule"] + (f" v{p['vpp']}" if p["vpp"] and p["vpp"] > 1 else ""))
    c.print(t)


def render_max_model(data: dict) -> None:
    c = _console()
    t = Table(title=f"Largest Llama-style model on {data['gpus']} x {data['gpu']}")
    for col in ("strategy", "parameters", "hidden", "layers"):
        t.add_column(col, justify="right")
    for r in data["results"]:
        t.add_row(r["strategy"], fmt_count(r["params"]) if r["params"] else "none fits",
                  str(r["hidden"] or "—"), str(r["layers"] or "—"))
    c.print(t)


def render_min_gpus(data: dict) -> None:
    c = _console()
    b = data["best"]
    p = b["parallel"]
    c.print(f"fewest GPUs for {data['tokens'] / 1e9:,.0f}B tokens in {data['deadline_days']:g} days: "
            f"[bold]{data['gpus']:,}[/] ({b['training']['days']:.1f} days with TP {p['tp']} PP {p['pp']} "
            f"DP {p['dp']} CP {p['cp']} ZeRO {p['zero']}, {b['time']['tokens_per_s']:,.0f} tokens/s, "
            f"global batch {p['gbs']:,} x {p['seq_len']:,})")
    c.print("tried: " + ", ".join(f"{t['gpus']:,} → {t['days']:.1f} d" if t["days"] else f"{t['gpus']:,} → none fits"
                                  for t in data["tried"]))


def render_bench(results: dict) -> None:
    """`trainplan bench`: one table per suite."""
    console = Console()
    m = results["machine"]
    console.print(f"[bold]{m['name']}[/bold] ({m['device']}, torch {m['torch']}, {m['date']})"
                  + (f" vs the {results['gpu']} datasheet" if results.get("gpu") else ""))
    for key, table in _BENCH_TABLES:
        if results.get(key):
            console.print(table(results[key]))


def _pct(v) -> str:
    return "" if v is None else f"{v:.1f}%"


def _gemm_table(rows: list[dict]) -> Table:
    """`trainplan bench`'s table of square GEMMs."""
    table = Table(title="GEMM C = A @ B (square, checked against float64)")
    for col in ("dtype", "n", "ms", "TFLOP/s", "% of peak", "rel. error"):
        table.add_column(col, justify="left" if col == "dtype" else "right")
    for r in rows:
        table.add_row(r["dtype"], str(r["n"]), f"{r['seconds'] * 1e3:.3f}", f"{r['tflops']:.3f}",
                      _pct(r.get("pct_of_peak")), f"{r['rel_error']:.1e}")
    return table


def _gemm_k_table(rows: list[dict]) -> Table:
    """`trainplan bench`'s table of GEMMs over the inner dimension."""
    table = Table(title=f"GEMM {rows[0]['m']} x k x {rows[0]['n']} over the inner dimension (bf16)")
    for col in ("k", "ms", "TFLOP/s", "% of peak"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(str(r["k"]), f"{r['seconds'] * 1e3:.3f}", f"{r['tflops']:.3f}", _pct(r.get("pct_of_peak")))
    return table


def _gemm_model_table(rows: list[dict]) -> Table:
    """`trainplan bench`'s table of the model's GEMM shapes."""
    table = Table(title=f"GEMM shapes of {rows[0]['model']} (bf16, one layer and the head, no TP)")
    for col in ("GEMM", "m x k x n", "ms", "TFLOP/s", "% of peak"):
        table.add_column(col, justify="left" if col == "GEMM" else "right")
    for r in rows:
        table.add_row(r["gemm"], f"{r['m']}x{r['k']}x{r['n']}", f"{r['seconds'] * 1e3:.3f}", f"{r['tflops']:.3f}",
                      _pct(r.get("pct_of_peak")))
    return table


def _memory_table(rows: list[dict]) -> Table:
    """`trainplan bench`'s table of memory bandwidth."""
    table = Table(title="Memory bandwidth (bytes read + written)")
    for col in ("kernel", "MiB moved", "ms", "GB/s", "% of spec"):
        table.add_column(col, justify="left" if col == "kernel" else "right")
    for r in rows:
        if r["gbs"] is None:
            table.add_row(r["kernel"], "", "", r.get("note") or "", "")
            continue
        table.add_row(r["kernel"], f"{r['bytes'] / 2**20:.0f}", f"{r['seconds'] * 1e3:.3f}", f"{r['gbs']:.1f}",
                      _pct(r.get("pct_of_spec")))
    return table


def _alignment_table(rows: list[dict]) -> Table:
    """`trainplan bench`'s table of aligned against unaligned GEMMs."""
    table = Table(title="Alignment (bf16; the aligned GEMM does more FLOPs)")
    for col in ("case", "unaligned ms", "aligned ms", "speedup"):
        table.add_column(col, justify="left" if col == "case" else "right")
    for r in rows:
        table.add_row(r["case"], f"{r['unaligned_s'] * 1e3:.3f}", f"{r['aligned_s'] * 1e3:.3f}",
                      f"{r['speedup']:.2f}x")
    return table


def _fusion_table(rows: list[dict]) -> Table:
    """`trainplan bench`'s table of fused against unfused element-wise ops."""
    table = Table(title=f"Fusion: residual + dropout(gelu(x + bias)), {rows[0]['elements']:,} {rows[0]['dtype']} "
                        "elements (outputs checked against float64; bytes as modelled)")
    for col in ("variant", "MiB moved", "ms", "GB/s", "speedup", "note"):
        table.add_column(col, justify="left" if col in ("variant", "note") else "right")
    for r in rows:
        table.add_row(r["variant"], f"{r['bytes'] / 2**20:.1f}", _ms(r["seconds"]), _num(r["gbs"], ".1f"),
                      _num(r["speedup"], ".2f", "x"), r["note"] or "")
    return table


def _tiling_table(rows: list[dict]) -> Table:
    """`trainplan bench`'s table of our tiled matmuls."""
    table = Table(title=f"Tiling: matmul {rows[0]['dtype']} (checked against float64)")
    for col in ("n", "kernel", "BMxBNxBK", "ms", "TFLOP/s", "vs torch", "note"):
        table.add_column(col, justify="right" if col in ("n", "ms", "TFLOP/s", "vs torch") else "left")
    for r in rows:
        table.add_row(str(r["n"]), r["kernel"], r["blocks"], _ms(r["seconds"]), _num(r["tflops"], ".3g"),
                      _num(r["vs_torch"], ".2f", "x"), r["note"] or "")
    return table


def _attention_table(rows: list[dict]) -> Table:
    """`trainplan bench`'s table of attention kernels."""
    r0 = rows[0]
    table = Table(title=f"Attention, causal ({r0['heads']} heads, head dim {r0['head_dim']}, {r0['dtype']}, "
                        "batch x seq constant; checked against float64)")
    for col in ("seq", "batch", "variant", "ms", "TFLOP/s", "vs SDPA", "peak MiB", "note"):
        table.add_column(col, justify="left" if col in ("variant", "note") else "right")
    for r in rows:
        table.add_row(str(r["seq"]), str(r["batch"]), r["variant"], _ms(r["seconds"]), _num(r["tflops"], ".3g"),
                      _num(r["vs_sdpa"], ".2f", "x"),
                      "" if r["peak_bytes"] is None else f"{r['peak_bytes'] / 2**20:,.0f}", r["note"] or "")
    return table


def _recompute_table(rows: list[dict]) -> Table:
    """`trainplan bench`'s table of recomputation's memory and time."""
    table = Table(title=f"Recompute ({rows[0]['layers']} layers, hidden {rows[0]['hidden']}, "
                        f"{rows[0]['tokens']:,} tokens; loss and gradients equal)")
    for col in ("recompute", "activations MiB", "vs none", "peak MiB", "step ms", "vs none"):
        table.add_column(col, justify="left" if col == "recompute" else "right")
    for r in rows:
        table.add_row(r["recompute"], f"{r['activation_bytes'] / 2**20:.1f}", f"{r['activation_ratio']:.2f}x",
                      "" if r["peak_bytes"] is None else f"{r['peak_bytes'] / 2**20:.0f}",
                      f"{r['step_s'] * 1e3:.1f}", f"{r['time_ratio']:.2f}x")
    return table


def _collectives_table(rows: list[dict]) -> Table:
    """`trainplan bench`'s table of collectives."""
    table = Table(title=f"Collectives across {rows[0]['world']} ranks (nccl-tests bus bandwidth; results checked)")
    for col in ("op", "size", "ms", "algbw GB/s", "busbw GB/s", "note"):
        table.add_column(col, justify="left" if col in ("op", "note") else "right")
    for r in rows:
        table.add_row(r["op"], "" if r["size"] is None else _bytes(r["size"]), _ms(r["seconds"]),
                      _num(r["algbw_gbs"], ".2f"), _num(r["busbw_gbs"], ".2f"), r["note"] or "")
    return table


# each suite's table, in the order they print
_BENCH_TABLES = (("gemm", _gemm_table), ("gemm_k", _gemm_k_table), ("gemm_model", _gemm_model_table), ("memory", _memory_table), ("alignment", _alignment_table), ("fusion", _fusion_table), ("tiling", _tiling_table), ("attention", _attention_table), ("recompute", _recompute_table), ("collectives", _collectives_table))


def _ms(seconds) -> str:
    return "" if seconds is None else f"{seconds * 1e3:.3f}"


def _num(value, fmt: str, suffix: str = "") -> str:
    return "" if value is None else f"{value:{fmt}}{suffix}"


def _bytes(size: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{size / scale:g} {unit}"
    return f"{size} B"


def render_bench_compare(table: dict) -> None:
    """`trainplan bench compare`: measurements down, runs across."""
    out = Table(title="Stored bench runs side by side")
    out.add_column("measurement")
    for run in table["runs"]:
        out.add_column(f"#{run['id']} {run['name']}\n{run['device']} {run['date'][:10]}"
                       + (" quick" if run["quick"] else ""), justify="right")
    for key, values in table["rows"].items():
        out.add_row(key, *("" if v is None else f"{v:,.3f}" for v in values))
    Console().print(out)
