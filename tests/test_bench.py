"""`trainplan bench` on the CPU at small sizes: kernels checked against float64, results
sane against a datasheet, and the profile round-trips into `plan` and `search`."""

import json

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


@pytest.fixture(scope="module")
def results():
    return run_bench(["gemm", "memory", "alignment", "recompute"], device="cpu", quick=True, gpu="A100-80GB-SXM",
                     model="gpt2", tokens=64)


def test_quick_cpu_suite_is_checked_and_sane(results):
    rows = results["gemm"]
    assert {r["dtype"] for r in rows} == {"fp32", "bf16"} and {r["n"] for r in rows} == set(gemm.QUICK_SIZES)
    for r in rows:
        assert 0 < r["rel_error"] <= gemm.TOLERANCE[r["dtype"]]
        # a CPU core reaches well under 10% of an A100's 19.5 (fp32) / 312 (bf16) TFLOP/s
        assert 0 < r["pct_of_peak"] < 10
    copy, triad = results["memory"]
    assert triad["bytes"] == 1.5 * copy["bytes"]  # copy moves 2 arrays, triad 3
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
    assert load_profile(str(path)) == pytest.approx(eff, rel=1e-5)
    best_gemm = max(r["tflops"] for r in results["gemm"] if r["dtype"] == "bf16")
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
    assert [r["kernel"] for r in data["memory"]] == ["copy", "triad"] and data["profile"] is None
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
