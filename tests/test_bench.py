"""`trainplan bench` on the CPU at small sizes: kernels checked against float64, results
sane against a datasheet, and the profile round-trips into `plan` and `search`."""

import json

import numpy as np
import pytest
from typer.testing import CliRunner

torch = pytest.importorskip("torch")

from trainplan.bench import gemm  # noqa: E402
from trainplan.bench.run import run_bench, write_profile  # noqa: E402
from trainplan.cli import app  # noqa: E402
from trainplan.errors import PlanError  # noqa: E402
from trainplan.plan import make_plan  # noqa: E402
from trainplan.profile import load_profile  # noqa: E402
from trainplan.report import evaluate  # noqa: E402


def _time_once(mp):
    """Each timing in these tests is one run with no warm-up: what they check is the checks
    against float64, the bytes, and the figures derived from a time (TFLOP/s, GB/s, ratios),
    which hold for any positive time; a CPU's median of 15 is no truer a GPU figure than one
    run. median_seconds itself is tested below."""
    from trainplan.bench import timing

    full = timing.median_seconds
    mp.setattr(timing, "median_seconds", lambda fn, device, warmup=3, repeats=15: full(fn, device, 0, 1))


@pytest.fixture(scope="module")
def results():
    with pytest.MonkeyPatch.context() as mp:
        _time_once(mp)
        return run_bench(["gemm", "memory", "alignment", "fusion", "tiling", "attention", "recompute", "collectives"],
                         device="cpu", quick=True, gpu="A100-80GB-SXM", model="gpt2", tokens=64)


def test_median_seconds_warms_up_then_takes_the_median_of_the_repeats(monkeypatch):
    from types import SimpleNamespace

    from trainplan.bench import timing

    calls, clock = [], iter([0.0, 3.0, 10.0, 11.0, 20.0, 27.0])  # three runs of 3, 1 and 7 s
    monkeypatch.setattr(timing, "time", SimpleNamespace(perf_counter=lambda: next(clock)))
    assert timing.median_seconds(lambda: calls.append(1), "cpu", warmup=2, repeats=3) == 3.0
    assert len(calls) == 2 + 3


def test_quick_cpu_suite_is_checked_and_sane(results):
    rows = results["gemm"]
    assert {r["dtype"] for r in rows} == {"fp32", "bf16"} and {r["n"] for r in rows} == set(gemm.QUICK_SIZES)
    for r in rows:
        assert 0 < r["rel_error"] <= gemm.TOLERANCE[r["dtype"]]
        # a CPU core reaches well under 10% of an A100's 19.5 (fp32) / 312 (bf16) TFLOP/s
        assert 0 < r["pct_of_peak"] < 10
    mn, depths = gemm.DEPTHS["quick"]
    assert [(r["m"], r["k"], r["n"], r["dtype"]) for r in results["gemm_k"]] == [(mn, k, mn, "bf16") for k in depths]
    assert all(0 < r["rel_error"] <= gemm.TOLERANCE["bf16"] and 0 < r["pct_of_peak"] < 10 for r in results["gemm_k"])
    copy, triad, contiguous, strided, pageable, pinned = results["memory"]
    assert triad["bytes"] == 1.5 * copy["bytes"]  # copy moves 2 arrays, triad 3
    # the same useful bytes (a quarter of the copy buffer, read and written) either way
    assert contiguous["bytes"] == strided["bytes"] == copy["bytes"] / 4
    assert strided["kernel"] == "copy, stride 16 reads" and strided["pct_of_spec"] is not None
    assert pageable["gbs"] is None and pinned["note"] == "needs a CUDA device"
    assert 0 < copy["pct_of_spec"] < 50  # host memory vs the A100's 2,039 GB/s HBM
    assert results["machine"]["device"] == "cpu" and results["machine"]["torch"] == torch.__version__


def test_alignment_pairs_are_timed_side_by_side(results):
    from trainplan.bench.alignment import QUICK_CASES

    rows = results["alignment"]
    assert [r["case"] for r in rows] == [c[0] for c in QUICK_CASES]
    for r, (_, tokens, hidden, odd, even) in zip(rows, QUICK_CASES, strict=True):
        assert even % 64 == 0 and odd % 64 != 0
        assert r["speedup"] == pytest.approx(r["unaligned_s"] / r["aligned_s"])
        # the TFLOP/s columns are the FLOPs of each shape over its own time
        assert r["aligned_tflops"] * r["aligned_s"] == pytest.approx(2 * tokens * hidden * even / 1e12)
        assert r["unaligned_tflops"] * r["unaligned_s"] == pytest.approx(2 * tokens * hidden * odd / 1e12)


def test_a_wrong_gemm_is_caught(monkeypatch):
    """The check compares with float64 on random inputs: a kernel that leaves the poisoned
    output (NaN) or computes the wrong product fails instead of being timed."""
    monkeypatch.setattr(torch, "matmul", lambda a, b, out: out)
    with pytest.raises(RuntimeError, match="wrong"):
        gemm.gemm_point(64, "fp32", "cpu")
    monkeypatch.setattr(torch, "matmul", lambda a, b, out: out.copy_(a @ b.T))
    with pytest.raises(RuntimeError, match="relative error"):
        gemm.gemm_point(64, "fp32", "cpu")


def test_profile_round_trips_into_plan_and_search(results, tmp_path):
    from trainplan.search import search

    path = tmp_path / "cpu-as-a100.toml"
    eff = write_profile(results, str(path))
    loaded = load_profile(str(path))
    curve = loaded.pop("gemm_curve")
    depth = loaded.pop("gemm_k_curve")
    if "gemm_shape" in eff:  # a CPU's timings may or may not follow the fitted form (gemm_shape_from)
        assert loaded.pop("gemm_shape") == pytest.approx(
            {k: eff["gemm_shape"][k] for k in ("mainloop", "k0", "overhead_us")}, rel=1e-5)
    else:
        assert "gemm_shape" not in loaded
    assert depth["k"] == [r["k"] for r in results["gemm_k"]]
    assert depth["fraction"] == pytest.approx([r["tflops"] / 312 for r in results["gemm_k"]], rel=1e-5)
    assert loaded.pop("flash_curve") == {"seq": eff["flash_curve"]["seq"],
                                         "fraction": pytest.approx(eff["flash_curve"]["fraction"], rel=1e-5)}
    assert loaded == pytest.approx({k: v for k, v in eff.items()
                                    if k not in ("gemm_curve", "gemm_k_curve", "flash_curve", "gemm_shape")}, rel=1e-5)
    bf16 = sorted((r for r in results["gemm"] if r["dtype"] == "bf16"), key=lambda r: r["n"])
    assert curve["n"] == [r["n"] for r in bf16]
    assert curve["fraction"] == pytest.approx([r["tflops"] / 312 for r in bf16], rel=1e-5)
    best_gemm = max(r["tflops"] for r in bf16)
    assert eff["gemm"] == pytest.approx(best_gemm / 312, rel=1e-5)  # A100 bf16 dense peak 312 TFLOP/s
    kw = dict(model="llama-3-8b", gpu="A100-80GB-SXM", gpus=8, gbs=64, seq_len=2048, tp=1, pp=1, zero=1, mbs=2)
    base = evaluate(make_plan(**kw)).time["step_s"]
    slow = evaluate(make_plan(**kw, gpu_profile=str(path))).time["step_s"]
    # GEMMs dominate an 8B step; at well under 1% of peak instead of the default ~80% the step
    # is more than 20x longer
    assert slow > 20 * base
    fixed = {"tp", "pp", "zero", "mbs"}
    found = search(make_plan(**kw, gpu_profile=str(path)), fixed, top=1)["best"][0]["time"]["step_s"]
    assert found == pytest.approx(slow, rel=1e-9)


def test_bench_cli_json_and_errors(tmp_path):
    runner = CliRunner()
    db = str(tmp_path / "bench.sqlite")
    res = runner.invoke(app, ["bench", "memory", "--quick", "--device", "cpu", "--json", "--db", db])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert [r["kernel"] for r in data["memory"]][:2] == ["copy", "triad"] and data["profile"] is None
    assert data["run_id"] == 1
    res = runner.invoke(app, ["bench", "compare", "--db", db, "--json"])
    assert res.exit_code == 0, res.output
    table = json.loads(res.output)
    assert table["rows"]["memory copy GB/s"] == [pytest.approx(data["memory"][0]["gbs"])]
    res = runner.invoke(app, ["bench", "compare", "9", "--db", db])
    assert res.exit_code == 2 and "no run 9" in res.output
    res = runner.invoke(app, ["bench", "tensor-cores", "--quick", "--device", "cpu", "--no-save"])
    assert res.exit_code == 2 and "suite" in res.output and "gemm, memory" in res.output
    out = tmp_path / "p.toml"
    res = runner.invoke(app, ["bench", "memory", "--quick", "--device", "cpu", "--profile", str(out), "--no-save"])
    assert res.exit_code == 2 and "--gpu" in res.output and not out.exists()


def test_profile_without_datasheet_is_refused():
    with pytest.raises(PlanError) as err:
        write_profile({"gpu": None, "machine": {}}, "/tmp/never.toml")
    assert err.value.field == "gpu"


def test_store_lines_up_runs_and_a_failed_write_stores_nothing(results, tmp_path):
    from trainplan.bench import store

    db = tmp_path / "runs.sqlite"
    first = store.save(results, db)
    second = store.save({**results, "machine": {**results["machine"], "name": "another machine"}}, db)
    runs = store.load(None, db)
    assert [r["id"] for r in runs] == [first, second]
    assert runs[0]["gemm"] == results["gemm"] and runs[1]["machine"]["name"] == "another machine"
    table = store.compare(runs)
    copy = results["memory"][0]["gbs"]
    assert table["rows"]["memory copy GB/s"] == [pytest.approx(copy), pytest.approx(copy)]
    n = results["gemm"][0]["n"]
    assert f"gemm fp32 {n}x{n}x{n} TFLOP/s" in table["rows"]
    broken = {**results, "memory": [{"kernel": "copy", "gbs": object()}]}  # not storable, mid-run
    with pytest.raises(TypeError):
        store.save(broken, db)
    assert [r["id"] for r in store.load(None, db)] == [first, second]  # nothing half-written
    with pytest.raises(PlanError) as err:
        store.load(None, tmp_path / "missing.sqlite")
    assert err.value.field == "db"


def test_recompute_trades_memory_for_time_without_changing_the_math(results):
    """Loss and gradients equal across variants (checked inside the suite, or it raises). Full
    recompute keeps each block's input only; with SDPA attention there is no s x s score
    matrix to drop, so selective recompute saves what no recompute does, within 0.1% (Korthikanti
    et al. 2022: selective recompute targets the attention scores)."""
    none, selective, full = results["recompute"]
    assert [r["recompute"] for r in (none, selective, full)] == ["none", "selective", "full"]
    assert selective["activation_bytes"] == pytest.approx(none["activation_bytes"], rel=1e-3)
    # 4 layers: the inputs of 4 blocks (4 x 512 tokens x 512 x 4 B = 4 MiB) plus head and loss
    # tensors, against every block's saved tensors: under a third
    assert full["activation_ratio"] < 1 / 3
    assert full["activation_bytes"] >= 4 * 512 * 512 * 4


def test_plot_is_drawn_and_a_bad_path_is_refused_before_measuring(results, tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from trainplan.bench.plots import draw_bench_plot

    out = tmp_path / "bench.png"
    draw_bench_plot(results, str(out))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    import trainplan.bench.run as bench_run

    monkeypatch.setattr(bench_run, "run_bench", lambda *a, **k: pytest.fail("measured before checking the path"))
    res = CliRunner().invoke(app, ["bench", "--quick", "--device", "cpu", "--no-save", "--plot", str(tmp_path / "x.gif")])
    assert res.exit_code == 2 and "plot" in res.output and ".png or .svg" in res.output


def test_model_gemm_shapes_are_the_models(results):
    """GPT-2 small (h 768, 4h MLP, vocab 50257) on 64 tokens: each projection, the MLP and
    the logits GEMM, checked and timed."""
    rows = results["gemm_model"]
    shapes = {r["gemm"]: (r["m"], r["k"], r["n"]) for r in rows}
    assert shapes == {"q": (64, 768, 768), "k": (64, 768, 768), "v": (64, 768, 768), "o": (64, 768, 768),
                      "up": (64, 768, 3072), "down": (64, 3072, 768), "logits": (64, 768, 50257)}
    assert all(0 < r["rel_error"] <= gemm.TOLERANCE["bf16"] and 0 < r["pct_of_peak"] < 10 for r in rows)


def test_bench_option_errors_name_the_field():
    runner = CliRunner()
    res = runner.invoke(app, ["bench", "gemm", "--quick", "--device", "cpu", "--no-save", "--tokens", "0"])
    assert res.exit_code == 2 and "tokens" in res.output
    res = runner.invoke(app, ["bench", "gemm", "--quick", "--device", "cpu", "--no-save", "--model", "gpt-7"])
    assert res.exit_code == 2 and "model" in res.output


# ------------------------------------------------------------ fusion, tiling, attention, collectives
def test_our_triton_kernels_match_float64_in_the_interpreter():
    """The kernels `bench` times on a GPU, run here by Triton's interpreter on shapes that are
    not multiples of the blocks (the edge masks) against float64."""
    pytest.importorskip("triton")
    from trainplan.bench import attention
    from trainplan.bench.triton_support import kernels

    k = kernels("cpu")
    gen = torch.Generator().manual_seed(0)
    for dtype, tol in ((torch.float32, 1e-6), (torch.float16, 1e-3)):
        a, b = torch.randn(70, 50, generator=gen, dtype=dtype), torch.randn(50, 90, generator=gen, dtype=dtype)
        ref = a.double() @ b.double()
        for out in (k.rowwise_matmul(a, b), k.tiled_matmul(a, b, bm=32, bn=64, bk=16, group_m=2)):
            assert torch.linalg.norm(out.double() - ref) / torch.linalg.norm(ref) < tol
    for causal in (True, False):
        q, kk, v = (torch.randn(2, 3, 100, 32, generator=gen) for _ in range(3))
        out = k.flash_attention(q, kk, v, causal=causal, bm=32, bn=16)
        ref = torch.nn.functional.scaled_dot_product_attention(q.double(), kk.double(), v.double(), is_causal=causal)
        assert torch.linalg.norm(out.double() - ref) / torch.linalg.norm(ref) < 1e-6
        if causal:
            attention._check(out, q, kk, v, "fp32", "triton flash")
            wrong = k.flash_attention(q, kk, v, causal=False, bm=32, bn=16)  # a kernel that ignores the mask
            with pytest.raises(RuntimeError, match="relative error"):
                attention._check(wrong, q, kk, v, "fp32", "triton flash")
    with pytest.raises(ValueError, match="head_dim"):
        k.flash_attention(*(torch.randn(1, 1, 16, 24) for _ in range(3)))


def test_fusion_variants_agree_and_a_wrong_one_is_caught(results):
    """Every variant computes residual + dropout(gelu(x + bias)): each element matches one of its
    two float64 values and 90% ± 6σ are kept (p = 0.1). Eager moves 9 tensor passes plus a
    one-byte mask, fused 3: 37/12 as many bytes in fp32."""
    from trainplan.bench import fusion

    rows = {r["variant"]: r for r in results["fusion"]}
    assert list(rows) == ["eager", "torch.compile", "triton fused"]
    assert rows["eager"]["bytes"] / rows["triton fused"]["bytes"] == pytest.approx(37 / 12)
    for name, r in rows.items():
        if name == "torch.compile" and r["note"]:  # inductor on a CPU needs a C++ compiler
            import shutil

            assert not (shutil.which("g++") or shutil.which("c++")), r["note"]
            continue
        assert 0 <= r["rel_error"] <= fusion.TOLERANCE["fp32"] and abs(r["kept"] - 0.9) < 0.01
    assert rows["eager"]["seconds"] > 0 and rows["triton fused"]["note"] == "interpreted: not timed"
    gen = torch.Generator().manual_seed(1)
    x, res = torch.randn(64, 128, generator=gen), torch.randn(64, 128, generator=gen)
    bias = torch.randn(128, generator=gen)
    unscaled = res + torch.nn.functional.gelu(x + bias) * (torch.rand(64, 128, generator=gen) >= 0.1)  # no 1/(1-p)
    with pytest.raises(RuntimeError, match="relative error"):
        fusion.check(unscaled, x, bias, res, 0.1, "fp32")
    half_dropped = res + torch.nn.functional.gelu(x + bias) / 0.9 * (torch.rand(64, 128, generator=gen) >= 0.5)
    with pytest.raises(RuntimeError, match="dropout kept"):
        fusion.check(half_dropped, x, bias, res, 0.1, "fp32")


def test_tiling_rows_are_checked_and_only_real_kernels_timed(results):
    from trainplan.bench import tiling

    rows = results["tiling"]
    assert [r["kernel"] for r in rows] == ["torch.matmul", "row at a time (no reuse)"] + ["tiled"] * len(
        tiling.QUICK_BLOCKS)
    assert [r["blocks"] for r in rows[2:]] == [f"{b[0]}x{b[1]}x{b[2]}" for b in tiling.QUICK_BLOCKS]
    for r in rows:
        assert 0 < r["rel_error"] <= gemm.TOLERANCE["fp16"] and r["n"] == 96
    assert rows[0]["seconds"] > 0 and rows[0]["vs_torch"] == 1
    assert all(r["seconds"] is None and "interpreted" in r["note"] for r in rows[1:])


def test_attention_memory_follows_the_seed_and_every_variant_is_checked(results):
    """Seed 004: S = 4096, d = 64, fp32: the score matrix is 4096² x 4 B = 67.1 MB per head,
    Q, K and V 3 x 4096 x 64 x 4 B ≈ 3.1 MB, 21.3x less."""
    from trainplan.bench import attention

    scores, qkv = attention.per_head_bytes(4096, 64, 4)
    assert scores / 1e6 == pytest.approx(67.1, abs=0.05) and qkv / 1e6 == pytest.approx(3.1, abs=0.05)
    assert scores / qkv == pytest.approx(21.3, abs=0.05)
    # FlashAttention-2's count: 4·b·h·s²·d for a full forward, half of it causal
    assert attention.flops(1, 1, 1024, 128) * 2 == attention.flops(1, 1, 1024, 128, causal=False) == 4 * 1024**2 * 128
    heads, head_dim, tokens, seqs = attention.QUICK
    rows = results["attention"]
    assert [r["seq"] for r in rows] == [s for s in seqs for _ in range(4)]
    for r in rows:
        assert r["batch"] * r["seq"] == tokens and r["heads"] == heads and r["head_dim"] == head_dim
        assert 0 < r["rel_error"] <= attention.TOLERANCE["fp32"]
        if r["variant"] == "sdpa fwd+bwd":
            assert 0 < r["grad_error"] <= attention.GRAD_TOLERANCE["fp32"] and r["vs_sdpa"] is None
        elif r["variant"] == "triton flash":
            assert r["seconds"] is None and "interpreted" in r["note"]
        else:
            assert r["seconds"] > 0 and r["peak_bytes"] is None  # no allocator counter on a CPU


def test_collectives_follow_nccl_tests_conventions(results):
    """Bus bandwidth = algbw x 2(n-1)/n for all-reduce and x (n-1)/n for all-gather and
    reduce-scatter (nccl-tests PERFORMANCE.md); each result checked against float64 sums."""
    from trainplan.bench import collectives

    assert collectives.bus_factor("all_reduce", 8) == pytest.approx(1.75)
    assert collectives.bus_factor("all_gather", 8) == collectives.bus_factor("reduce_scatter", 8) == 0.875
    rows = results["collectives"]
    assert [(r["op"], r["size"]) for r in rows] == [(op, s) for op in collectives.OPS for s in collectives.QUICK_SIZES]
    for r in rows:
        assert r["world"] == 2 and r["rel_error"] <= collectives.TOLERANCE
        assert r["algbw_gbs"] == pytest.approx(r["size"] / r["seconds"] / 1e9)
        assert r["busbw_gbs"] == pytest.approx(r["algbw_gbs"] * collectives.bus_factor(r["op"], 2))


def test_profile_takes_flash_attention_from_sdpa_training_and_not_nvlink_from_gloo(results, tmp_path):
    eff = write_profile(results, str(tmp_path / "p.toml"))
    longest = [r for r in results["attention"] if r["variant"] == "sdpa fwd+bwd"][-1]
    assert eff["flash"] == pytest.approx(longest["tflops"] / 19.5, rel=1e-9)  # A100 fp32 peak 19.5 TFLOP/s
    assert "nvlink" not in eff  # processes on one CPU are not a link
    assert load_profile(str(tmp_path / "p.toml"))["flash"] == pytest.approx(eff["flash"], rel=1e-5)
    # and at every sequence length measured, for the time model's curve
    training = [r for r in results["attention"] if r["variant"] == "sdpa fwd+bwd"]
    assert eff["flash_curve"]["seq"] == [r["seq"] for r in training]
    assert eff["flash_curve"]["fraction"] == pytest.approx([r["tflops"] / 19.5 for r in training], rel=1e-9)


def test_every_suite_renders_and_is_stored(results, tmp_path):
    from trainplan.bench import store
    from trainplan.render import render_bench

    render_bench(results)  # no suite's table breaks on untimed rows
    table = store.compare(store.load([store.save(results, tmp_path / "s.sqlite")], tmp_path / "s.sqlite"))
    keys = set(table["rows"])
    assert {"fusion eager fp32 ms", "tiling 96^3 torch.matmul TFLOP/s", "attention seq 64 sdpa TFLOP/s",
            "all_reduce 1048576 B x2 busbw GB/s"} <= keys
    assert not any("triton" in k for k in keys)  # interpreted kernels are not timed, so not compared


def test_report_states_headline_figures_against_targets(results, tmp_path):
    from trainplan.bench import report

    figures = {name: (value, note) for name, value, note in report.headline(results)}
    copy = results["memory"][0]
    assert figures["device copy bandwidth"][0].startswith(f"{copy['gbs'] / 1e3:.3f} TB/s")
    contiguous, strided = results["memory"][2:4]
    assert figures["coalesced / strided reads"][0] == f"{contiguous['gbs'] / strided['gbs']:.1f}x"
    assert "tiled Triton matmul / torch.matmul" not in figures  # interpreted on a CPU: nothing timed to compare
    # the verdicts against the targets (80% of torch.matmul, 50% of SDPA), on rows as a GPU writes them
    gpu_rows = {"tiling": [{"n": 4096, "kernel": "tiled", "blocks": "128x256x64", "dtype": "bf16", "seconds": 1e-3,
                            "vs_torch": 0.84}],
                "attention": [{"seq": s, "variant": "triton flash", "seconds": 1e-3, "vs_sdpa": r, "head_dim": 128,
                               "tflops": 400.0, "peak_bytes": 2**20} for s, r in ((2048, 0.9), (4096, 0.45))]}
    figures = {name: (value, note) for name, value, note in report.headline({**results, **gpu_rows})}
    assert figures["tiled Triton matmul / torch.matmul"] == ("0.84x", "4096³ bf16, best blocks 128x256x64; "
                                                             "target ≥ 0.80x: meets")
    assert figures["Triton FlashAttention forward / SDPA"][1].endswith("target ≥ 0.50x: below")  # seq 4096 chosen
    assert figures["triton flash peak memory, seq 2048 -> 4096"][0] == "1.00x"
    path = tmp_path / "bench.md"
    res = CliRunner().invoke(app, ["bench", "alignment", "--quick", "--device", "cpu", "--no-save", "--report",
                                   str(path)])
    assert res.exit_code == 0, res.output
    text = path.read_text()
    assert text.startswith("# trainplan bench: ") and "| alignment: GPT-2 logits" in text and "## alignment" in text
    res = CliRunner().invoke(app, ["bench", "alignment", "--quick", "--device", "cpu", "--no-save", "--report",
                                   str(tmp_path / "bench.txt")])
    assert res.exit_code == 2 and "report" in res.output and ".md" in res.output


def test_without_triton_the_suites_say_so_and_still_measure_the_rest(monkeypatch):
    from trainplan.bench import attention, fusion, tiling, triton_support

    def missing(device):
        raise triton_support.Unavailable("Triton is not installed (pip install 'trainplan[triton]')")

    monkeypatch.setattr(triton_support, "kernels", missing)
    rows = tiling.run("cpu", quick=True)
    assert [r["kernel"] for r in rows] == ["torch.matmul", "triton"] and rows[0]["seconds"] > 0
    assert rows[1]["note"].startswith("unavailable: Triton is not installed")
    rows = attention.run("cpu", quick=True)
    flash = [r for r in rows if r["variant"] == "triton flash"]
    assert len(flash) == len(attention.QUICK[3]) and all("not installed" in r["note"] for r in flash)
    assert all(r["grad_error"] is None and r["rel_error"] is None for r in flash)
    rows = fusion.run("cpu", quick=True)
    assert rows[-1]["variant"] == "triton fused" and "not installed" in rows[-1]["note"]


def test_triton_loaded_interpreted_is_not_offered_for_a_gpu():
    """Triton decides interpreted or compiled once per process: after the CPU run, a CUDA run in
    the same process is refused with the reason, not run interpreted and timed as a GPU's."""
    pytest.importorskip("triton")
    from trainplan.bench import triton_support

    assert triton_support.kernels("cpu").INTERPRETED
    with pytest.raises(triton_support.Unavailable, match="interpreted earlier in this process"):
        triton_support.kernels("cuda")
    kernels, reason = triton_support.kernels_or_reason("cuda")
    assert kernels is None and reason.startswith("unavailable: Triton was loaded interpreted")


def test_a_measured_gemm_curve_sets_the_efficiency_of_each_size(tmp_path):
    """With a profile's square-GEMM sweep, the time model's efficiency at a measured size is the
    measured fraction times the training share (what quantization explains is not counted
    twice), log-interpolated between sizes; small GEMMs slow a narrow model more than a wide one."""
    from trainplan.estimate.gemm_rates import (
        GemmResiduals,
        gemm_efficiency,
        gemm_residual_curve,
        gemm_training_fraction,
    )

    ratio = gemm_training_fraction("H100-SXM")
    sweep = {"n": [1024, 2048, 4096, 8192, 16384], "fraction": [0.15, 0.45, 0.70, 0.79, 0.80]}
    curve = GemmResiduals(size=gemm_residual_curve(sweep, sms=132))
    best = max(sweep["fraction"]) * ratio
    checked = 0
    for n, frac in zip(sweep["n"], sweep["fraction"], strict=True):
        if frac / 0.80 < gemm_efficiency(n, n, n, 1.0, 132):  # below what quantization alone explains
            assert gemm_efficiency(n, n, n, best, 132, curve=curve) == pytest.approx(frac * ratio, rel=1e-12)
            checked += 1
    assert checked == 3  # 1024, 2048, 4096; at 8192 quantization alone explains the shortfall
    mid = gemm_efficiency(1448, 1448, 1448, best, 132, curve=curve)  # between 1024 and 2048
    assert gemm_efficiency(1024, 1024, 1024, best, 132, curve=curve) < mid < gemm_efficiency(2048, 2048, 2048, best,
                                                                                              132, curve=curve)
    path = tmp_path / "h100.toml"
    path.write_text("[efficiency]\ngemm = 0.80\n[gemm_curve]\n"
                    f"n = {sweep['n']}\nfraction = {sweep['fraction']}\n")
    flat = tmp_path / "flat.toml"
    flat.write_text("[efficiency]\ngemm = 0.80\n")

    def slowdown(model, tokens):
        kw = dict(model=model, gpu="H100-SXM", gpus=8, tp=1, pp=1, zero=3, mbs=1, seq_len=tokens, gbs=8)
        return (evaluate(make_plan(**kw, gpu_profile=str(path))).time["step_s"]
                / evaluate(make_plan(**kw, gpu_profile=str(flat))).time["step_s"])

    narrow, wide = slowdown("gpt2", 1024), slowdown("llama-3-70b", 4096)
    assert narrow > wide >= 1.0 and narrow > 1.2
    bad = tmp_path / "bad.toml"
    bad.write_text("[efficiency]\ngemm = 0.8\n[gemm_curve]\nn = [4096, 1024]\nfraction = [0.7, 0.2]\n")
    with pytest.raises(PlanError, match="increasing"):
        load_profile(str(bad))
    # the search's bulk evaluation uses the curve exactly as a single plan does
    from trainplan.search import search

    kw = dict(model="llama-3-8b", gpu="H100-SXM", gpus=16, gbs=64, seq_len=2048, gpu_profile=str(path))
    best_found = search(make_plan(**kw), set(), top=1)["best"][0]
    p = best_found["parallel"]
    again = evaluate(make_plan(**kw, tp=p["tp"], pp=p["pp"], cp=p["cp"], zero=p["zero"], mbs=p["mbs"], sp=p["sp"],
                               recompute=p["recompute"], schedule=p["schedule"],
                               **({"vpp": p["vpp"]} if p["schedule"] == "interleaved" else {})))
    assert again.time["step_s"] == pytest.approx(best_found["time"]["step_s"], rel=1e-12)


def test_the_timed_path_of_our_kernels_runs_as_on_a_gpu(monkeypatch):
    """On a GPU our kernels are timed and compared with the vendor's; here the interpreter is
    timed instead (numbers meaningless, code path the same): ratios and the report's targets."""
    pytest.importorskip("triton")
    from trainplan.bench import attention, fusion, report, tiling, triton_support

    monkeypatch.setattr(triton_support, "timed", lambda device: True)
    _time_once(monkeypatch)
    tiled = tiling.run("cpu", quick=True)
    assert all(r["seconds"] > 0 and r["vs_torch"] == pytest.approx(tiled[0]["seconds"] / r["seconds"]) for r in tiled)
    attn_rows = attention.run("cpu", quick=True)
    attn = [r for r in attn_rows if r["variant"] == "triton flash"]
    assert all(r["seconds"] > 0 and r["tflops"] > 0 and r["vs_sdpa"] > 0 and r["note"] is None for r in attn)
    fused = fusion.run("cpu", quick=True)[-1]
    assert fused["variant"] == "triton fused" and fused["seconds"] > 0 and fused["speedup"] > 0
    names = {name for name, _, _ in report.headline({"tiling": tiled, "attention": attn_rows})}
    assert {"tiled Triton matmul / torch.matmul", "Triton FlashAttention forward / SDPA"} <= names


def test_a_measured_inner_dimension_sweep_slows_short_k_gemms(tmp_path):
    """A profile's k sweep at fixed m = n gives each GEMM the measured share at its inner
    dimension (relative to the best k); the square sweep's residual then leaves out what the k
    sweep explains, so a square curve that is all k effect adds nothing more. Narrow models
    (short k) slow down more than wide ones."""
    from trainplan.estimate.gemm_rates import (
        GemmResiduals,
        gemm_depth_residual,
        gemm_efficiency,
        gemm_residual_curve,
    )

    ks = [256, 512, 1024, 2048, 4096, 8192, 16384]
    frac = [0.30, 0.48, 0.62, 0.71, 0.77, 0.80, 0.80]
    depth = gemm_depth_residual({"k": ks, "fraction": frac})
    assert depth[1] == pytest.approx([f / 0.80 for f in frac])
    residuals = GemmResiduals(depth=depth)
    # m = n = 8192 at k = 1024: the measured 0.62 of the best 0.80, with nothing else changed
    full = gemm_efficiency(8192, 8192, 1024, 0.7, 132)
    assert gemm_efficiency(8192, 8192, 1024, 0.7, 132, curve=residuals) == pytest.approx(full * 0.62 / 0.80)
    # a square sweep that k and quantization explain entirely leaves a residual of 1
    sq = [2048, 4096, 8192, 16384]
    explained = {"n": sq, "fraction": [0.8 * float(gemm_efficiency(n, n, n, 1.0, 132)) * float(np.interp(
        np.log2(n), *depth)) for n in sq]}
    assert gemm_residual_curve(explained, 132, depth)[1] == pytest.approx([1.0] * 4)
    with_k = tmp_path / "k.toml"
    with_k.write_text(f"[efficiency]\ngemm = 0.80\n[gemm_k_curve]\nk = {ks}\nfraction = {frac}\n")
    flat = tmp_path / "flat.toml"
    flat.write_text("[efficiency]\ngemm = 0.80\n")

    def slowdown(model):
        kw = dict(model=model, gpu="H100-SXM", gpus=8, tp=1, pp=1, zero=3, mbs=1, seq_len=4096, gbs=8)
        return (evaluate(make_plan(**kw, gpu_profile=str(with_k))).time["step_s"]
                / evaluate(make_plan(**kw, gpu_profile=str(flat))).time["step_s"])

    # qwen2.5-0.5b: h = 896, forward k of 896 and 4864; llama-3-70b: every forward k at least
    # 8192, the best measured, so only its weight gradients (inner dimension: the 4,096 tokens,
    # 0.77 of 0.80) slow down
    assert slowdown("qwen2.5-0.5b") > 1.08 and 1.0 < slowdown("llama-3-70b") < 1.02
    bad = tmp_path / "bad.toml"
    bad.write_text("[efficiency]\ngemm = 0.8\n[gemm_k_curve]\nk = [512]\nfraction = [0.5]\n")
    with pytest.raises(PlanError, match="gemm_k_curve"):
        load_profile(str(bad))


def test_a_profile_fits_the_gemm_shape_of_its_sweeps_and_the_time_model_uses_it(tmp_path):
    """bench's square and inner-dimension sweeps, fitted as 2mnk / R + m·n·b + t0: sweeps timed
    from OpenXLA's measured H100 table (benchmarks/data/h100_matmul_xla.toml: the squares 1024,
    2048, 4096 and k = 256..4096 at m = n = 4096) give the catalog's Hopper fit back within the
    rounding of that table, and a plan with the profile prices GEMMs with it."""
    import tomllib
    from pathlib import Path

    from trainplan.bench.run import profile_from
    from trainplan.estimate.gemm_shape import GemmShape
    from trainplan.estimate.hardware import hardware
    from trainplan.plan import conventions, resolve

    table = tomllib.loads((Path(__file__).parents[1] / "benchmarks/data/h100_matmul_xla.toml").read_text())
    rows = {(m, n, k): tf for m, n, k, tf in table["rows"]}
    point = lambda m, n, k: {"m": m, "n": n, "k": k, "dtype": "bf16", "tflops": rows[m, n, k],  # noqa: E731
                             "seconds": 2 * m * n * k / (rows[m, n, k] * 1e12)}
    results = {"gpu": "H100-SXM", "machine": {"device": "cuda"},
               "gemm": [point(s, s, s) for s in (1024, 2048, 4096)],
               "gemm_k": [point(4096, 4096, k) for k in (256, 512, 1024, 2048, 4096)]}
    shape = profile_from(results)["gemm_shape"]
    catalog_fit = conventions()["efficiency"]["gemm_shape"]["H100-SXM"]
    assert shape["mainloop"] == pytest.approx(catalog_fit["mainloop"], rel=0.02)
    assert shape["k0"] == pytest.approx(catalog_fit["k0"], rel=0.15)
    assert shape["overhead_us"] == pytest.approx(catalog_fit["overhead_us"], rel=0.2)
    assert shape["points"] == 7 and shape["mean_error"] < 0.03
    path = tmp_path / "h100.toml"
    path.write_text("[efficiency]\ngemm = 0.79\n[gemm_shape]\n"
                    + "".join(f"{k} = {shape[k]}\n" for k in ("mainloop", "k0", "overhead_us")))
    layout = resolve(make_plan(model="llama-3-8b", gpu="A100-80GB-SXM", gpus=8, gpu_profile=str(path)))
    curve = hardware(layout, load_profile(str(path))).gemm_curve
    assert isinstance(curve, GemmShape) and curve.k0 == pytest.approx(shape["k0"])
    assert curve.overhead_s == pytest.approx(shape["overhead_us"] * 1e-6)
    for bad, field in (("mainloop = 0\nk0 = 148\noverhead_us = 6", "gemm_shape.mainloop"),
                       ("mainloop = 0.9\nk0 = -1\noverhead_us = 6", "gemm_shape.k0"),
                       ("mainloop = 0.9\nk0 = 148", "gemm_shape.overhead_us")):
        path.write_text(f"[efficiency]\ngemm = 0.79\n[gemm_shape]\n{bad}\n")
        with pytest.raises(PlanError, match=field):
            load_profile(str(path))


def test_profile_toml_is_written_by_a_library_that_quotes_what_it_must(tmp_path):
    """The profile is TOML written by tomli-w, not by hand: a machine name with quotes and a
    backslash reads back as it was. A100 80GB: 312 TFLOP/s bf16 dense, 2.039 TB/s HBM."""
    import tomllib

    results = {"gpu": "A100-80GB-SXM", "quick": True,
               "machine": {"name": 'rack "7" \\ node', "device": "cpu", "torch": "2.13", "date": "2026-12-01"},
               "gemm": [{"dtype": "bf16", "m": n, "n": n, "k": n, "tflops": t} for n, t in ((1024, 156.0), (2048, 234.0))],
               "memory": [{"kernel": "copy", "gbs": 1019.5}]}
    path = tmp_path / "p.toml"
    eff = write_profile(results, str(path))
    data = tomllib.loads(path.read_text())
    assert data["measured_on"] == 'rack "7" \\ node (cpu, torch 2.13)' and data["source"] == "trainplan bench --quick"
    assert data["efficiency"] == {"gemm": 0.75, "hbm": 0.5} and eff["gemm"] == 0.75
    assert data["gemm_curve"] == {"dtype": "bf16", "n": [1024, 2048], "fraction": [0.5, 0.75]}
    assert load_profile(str(path))["gemm"] == 0.75
    assert path.read_text().startswith("# trainplan hardware profile")
