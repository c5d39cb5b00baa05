"""A Markdown report of a bench run (`trainplan bench --report FILE.md`): the headline figures
with their targets first, then every suite's rows. The report is generated from the
measurements, never edited by hand."""

from __future__ import annotations

from pathlib import Path

from ..errors import PlanError

# (figure, target ratio): what a good kernel of ours reaches against the vendor's
TARGETS = {"tiled Triton matmul / torch.matmul": 0.80, "Triton FlashAttention forward / SDPA": 0.50}
SEQ_OF_INTEREST = 4096


def _closest(rows, key, value):
    return min(rows, key=lambda r: abs(r[key] - value)) if rows else None


def headline(results: dict) -> list[tuple[str, str, str]]:
    """(figure, measured, note) for each headline figure the run has."""
    out = []
    gemm = [r for r in results.get("gemm") or [] if r["dtype"] == "bf16"]
    if gemm:
        r = _closest(gemm, "n", 8192)
        pct = f" ({r['pct_of_peak']:.1f}% of peak)" if r.get("pct_of_peak") else ""
        out.append((f"bf16 GEMM {r['n']}³", f"{r['tflops']:.1f} TFLOP/s{pct}", ""))
    for r in results.get("memory") or []:
        if r["kernel"] == "copy":
            pct = f" ({r['pct_of_spec']:.1f}% of spec)" if r.get("pct_of_spec") else ""
            out.append(("device copy bandwidth", f"{r['gbs'] / 1e3:.3f} TB/s{pct}", "bytes read + written"))
    mem = {r["kernel"]: r for r in results.get("memory") or [] if r["gbs"]}
    strided = next((k for k in mem if k.startswith("copy, stride")), None)
    if strided and "copy, contiguous reads" in mem:
        out.append(("coalesced / strided reads", f"{mem['copy, contiguous reads']['gbs'] / mem[strided]['gbs']:.1f}x",
                    f"same useful bytes, {strided.split(', ')[1]}"))
    if "host->device, pinned" in mem and "host->device, pageable" in mem:
        out.append(("pinned / pageable host->device",
                    f"{mem['host->device, pinned']['gbs'] / mem['host->device, pageable']['gbs']:.2f}x",
                    f"pinned {mem['host->device, pinned']['gbs']:.1f} GB/s"))
    tiling = [r for r in results.get("tiling") or [] if r["seconds"]]
    if tiling:
        n = max(r["n"] for r in tiling)
        at_n = [r for r in tiling if r["n"] == n]
        tiled = [r for r in at_n if r["kernel"] == "tiled"]
        if tiled:
            best = max(tiled, key=lambda r: r["vs_torch"])
            out.append(_against_target("tiled Triton matmul / torch.matmul", best["vs_torch"],
                                       f"{n}³ {best['dtype']}, best blocks {best['blocks']}"))
        naive = [r for r in at_n if r["kernel"].startswith("row")]
        if naive:
            out.append(("matmul without on-chip reuse / torch.matmul", f"{naive[0]['vs_torch']:.3f}x", f"{n}³"))
    attention = results.get("attention") or []
    flash = [r for r in attention if r["variant"] == "triton flash" and r["seconds"]]
    if flash:
        r = _closest(flash, "seq", SEQ_OF_INTEREST)
        out.append(_against_target("Triton FlashAttention forward / SDPA", r["vs_sdpa"],
                                   f"seq {r['seq']}, head dim {r['head_dim']}, {r['tflops']:.0f} TFLOP/s"))
    for variant in ("materialized", "triton flash", "sdpa"):
        pts = sorted((r for r in attention if r["variant"] == variant and r["peak_bytes"]), key=lambda r: r["seq"])
        if len(pts) >= 2:
            growth = pts[-1]["peak_bytes"] / pts[0]["peak_bytes"]
            out.append((f"{variant} peak memory, seq {pts[0]['seq']} -> {pts[-1]['seq']}", f"{growth:.2f}x",
                        "tokens constant: flat when memory is linear in seq, x seq ratio when quadratic"))
    for r in results.get("alignment") or []:
        out.append((f"alignment: {r['case']}", f"{r['speedup']:.2f}x", "aligned does more FLOPs"))
    fusion = {r["variant"]: r for r in results.get("fusion") or []}
    for variant in ("torch.compile", "triton fused"):
        if fusion.get(variant, {}).get("speedup"):
            out.append((f"fusion: {variant} / eager", f"{fusion[variant]['speedup']:.2f}x",
                        f"{fusion[variant]['gbs']:.0f} GB/s effective"))
    recompute = {r["recompute"]: r for r in results.get("recompute") or []}
    if "full" in recompute:
        r = recompute["full"]
        out.append(("full recompute: activations / time", f"{r['activation_ratio']:.2f}x / {r['time_ratio']:.2f}x",
                    "relative to no recompute"))
    reduces = [r for r in results.get("collectives") or [] if r["op"] == "all_reduce" and r["busbw_gbs"]]
    if reduces:
        r = max(reduces, key=lambda r: r["size"])
        out.append((f"all-reduce bus bandwidth, {r['world']} ranks", f"{r['busbw_gbs']:.1f} GB/s",
                    f"{r['size'] / 2**20:g} MiB"))
    return out


def _against_target(name: str, ratio: float, detail: str) -> tuple[str, str, str]:
    target = TARGETS[name]
    verdict = "meets" if ratio >= target else "below"
    return name, f"{ratio:.2f}x", f"{detail}; target ≥ {target:.2f}x: {verdict}"


def _table(rows: list[dict]) -> list[str]:
    keys = list(dict.fromkeys(k for r in rows for k in r))
    fmt = lambda v: "" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v))  # noqa: E731
    return ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys),
            *("| " + " | ".join(fmt(r.get(k)) for k in keys) + " |" for r in rows)]


def to_markdown(results: dict) -> str:
    m = results["machine"]
    lines = [f"# trainplan bench: {m['name']}", "",
             f"Measured on {m['name']} ({m['device']}), torch {m['torch']}, {m['date']}"
             + (f"; percentages against the {results['gpu']} datasheet" if results.get("gpu") else "")
             + (" (quick sizes)" if results.get("quick") else "") + ". Every kernel was checked against "
             "float64 before it was timed; kernels run in Triton's interpreter are checked, not timed.", "",
             "## Headline figures", "", "| figure | measured | note |", "|---|---|---|",
             *(f"| {a} | {b} | {c} |" for a, b, c in headline(results)), ""]
    for suite in ("gemm", "gemm_k", "gemm_model", "memory", "alignment", "fusion", "tiling", "attention", "recompute",
                  "collectives"):
        if results.get(suite):
            lines += [f"## {suite}", "", *_table(results[suite]), ""]
    return "\n".join(lines)


def check_path(path: str) -> Path:
    """The report's path, or PlanError naming the rule it breaks (checked before measuring)."""
    target = Path(path)
    if target.suffix != ".md":
        raise PlanError("report", f"the report is Markdown: give a .md path (got {path})")
    if not target.parent.exists():
        raise PlanError("report", f"directory {target.parent} does not exist")
    return target


def write_report(results: dict, path: str) -> None:
    """Write the report atomically: a finished file or none."""
    target = check_path(path)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(to_markdown(results))
    tmp.replace(target)
