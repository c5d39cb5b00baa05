"""Time model: FLOPs formulas, collective costs, whole-run arithmetic from the seeds, and the
profile round-trip."""

import numpy as np
import pytest

from trainplan.errors import PlanError
from trainplan.estimate import comm
from trainplan.estimate.cost import goodput, training_run
from trainplan.estimate.flops import step_flops
from trainplan.estimate.recipe import recipe
from trainplan.plan import make_plan, resolve
from trainplan.report import evaluate, to_json
from trainplan.specs import catalog
from trainplan.specs.model import ModelSpec


def gpt(h, a, L, v=51200, s=2048):
    return ModelSpec(name="gpt", source="test", layers=L, hidden=h, heads=a, ffn=4 * h, mlp="gelu", vocab=v,
                     tied_embeddings=True, norm="layernorm", position="learned", max_position=s, fused_qkv=True)


@pytest.mark.parametrize("h,a,L", [(6144, 64, 48), (12288, 96, 96), (20480, 128, 105), (25600, 160, 128)])
def test_megatron_model_flops_formula(h, a, L):
    """Korthikanti et al. 2023 App. A: model FLOPs per iteration 72·B·L·s·h²·(1 + s/(6h) + v/(12hL))."""
    B, s, v = 8, 2048, 51200
    fl = step_flops(gpt(h, a, L), tokens=B * s, seq=s, dense_layers=L, moe_layers=0, head=1,
                    attention_eager=True, recompute=0)
    assert float(fl["model"]) == pytest.approx(72 * B * L * s * h * h * (1 + s / (6 * h) + v / (12 * h * L)), rel=1e-12)


@pytest.mark.parametrize("h,a,L", [(2304, 24, 24), (12288, 96, 80)])
def test_narayanan_96_count_is_hardware_flops_with_full_recompute(h, a, L):
    """Narayanan et al. 2021 Eq. 3: F = 96·B·s·l·h²·(1 + s/(6h) + V/(16lh)) counts a recomputed
    forward (4 passes): our hardware FLOPs under full recompute."""
    B, s, V = 4, 2048, 51200
    fl = step_flops(gpt(h, a, L), tokens=B * s, seq=s, dense_layers=L, moe_layers=0, head=1,
                    attention_eager=True, recompute=2)
    assert float(fl["hardware"]) == pytest.approx(96 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h)), rel=1e-12)


def test_six_n_d_for_llama():
    """The 6·N·D rule (Kaplan et al. 2020): for Llama-2-7B at s = 2048 the model FLOPs per
    token are 6·N (non-embedding parameters, plus the output head) and the attention term
    12·L·h·s (PaLM's 6N + 12·L·H·Q·T)."""
    m = catalog.model("llama-2-7b")
    s = 2048
    # (PaLM counts the attention backward as 2x its forward: the materialised-scores count)
    fl = step_flops(m, tokens=s, seq=s, dense_layers=m.layers, moe_layers=0, head=1, attention_eager=True, recompute=0)
    n_matmul = m.params - m.embedding_params - m.layers * 2 * m.hidden - m.hidden  # minus norms
    assert float(fl["model"]) / s == pytest.approx(6 * n_matmul + 12 * m.layers * m.hidden * s, rel=1e-12)
    assert float(fl["model"]) / s == pytest.approx(6 * m.params, rel=0.15)


def test_moe_active_flops():
    """Mixtral routes each token to 2 of 8 experts: FLOPs follow the 12.9B active parameters."""
    m = catalog.model("mixtral-8x7b")
    fl = step_flops(m, tokens=1, seq=1, dense_layers=0, moe_layers=m.layers, head=1, attention_eager=True, recompute=0)
    active_matmul = m.active_params - m.embedding_params - m.layers * 2 * m.hidden - m.hidden
    attention = 3 * m.layers * 2 * (m.q_dim + m.attn_out_dim)  # one key: 2·(q + v) forward, x3
    assert float(fl["model"]) == pytest.approx(6 * active_matmul + attention, rel=1e-12)


def test_nccl_bus_factors():
    """nccl-tests doc/PERFORMANCE.md: busbw factors 2(n-1)/n all-reduce, (n-1)/n all-gather,
    reduce-scatter, all-to-all; 1 for send/recv."""
    assert comm.bus_factor(comm.ALL_REDUCE, 8) == pytest.approx(2 * 7 / 8)
    for kind in (comm.ALL_GATHER, comm.REDUCE_SCATTER, comm.ALL_TO_ALL):
        assert comm.bus_factor(kind, 8) == pytest.approx(7 / 8)
    assert comm.bus_factor(comm.SEND_RECV, 2) == 1.0
    # 1 GiB all-reduce on 8 GPUs at 232.5 GB/s busbw (8 x A100, nccl-tests issue #175)
    t = comm.collective_time(comm.ALL_REDUCE, 2**30, 8, 232.5e9, 0.0)
    assert float(t) == pytest.approx(2 * 7 / 8 * 2**30 / 232.5e9)
    assert float(comm.collective_time(comm.ALL_REDUCE, 2**30, 1, 232.5e9, 1e-5)) == 0.0


def test_group_bandwidth_hierarchy():
    nv, nic = 360e9, 45e9
    assert comm.group_busbw(8, 1, 8, nv, nic) == nv  # TP 8 inside a node
    assert comm.group_busbw(4, 8, 8, nv, nic) == nic  # DP across nodes, one rank per node
    assert comm.group_busbw(64, 1, 8, nv, nic) == pytest.approx(min(nv, 8 * nic))  # all NICs


def test_napkin_1_5_llama2_70b_on_1024_h100():
    """Seed 004, Napkin Math 1.5: 6 x 70e9 x 2e12 = 8.4e23 FLOPs at 50% of 989 TFLOP/s on
    1,024 H100 -> 19.2 days; at $3/GPU-hour about $1.42M."""
    flops_per_token = 6 * 70e9
    tflops = 0.5 * 989e12
    gpus = 1024
    run = training_run(tokens=2e12, tokens_per_step=1.0, step_s=flops_per_token / (tflops * gpus), gpus=gpus,
                       price_per_gpu_hour=3.0, gpu_power_w=700, gpus_per_host=8, host_power_w=0, pue=1.0,
                       grid_kg_per_kwh=0.0)
    assert run["days"] == pytest.approx(19.2, abs=0.05)
    assert run["cost_usd"] == pytest.approx(1.42e6, rel=0.01)


def test_napkin_1_10_the_network_wall(tmp_path):
    """Seed 004, Napkin Math 1.10: 8 GPUs, one per node, on a 100 Gb/s network; a 7B model's
    fp16 gradients (14 GB) all-reduced by a ring move 2(N-1)/N = 1.75 x 14 = 24.5 GB per worker,
    24.5 GB / 12.5 GB/s = 1.96 s. The plan with the seed's cluster (--gpus-per-node 1
    --nic-gbps 100) and the seed's assumption that the wire runs at line rate (a profile's nic
    fraction of 1.0) gives the ring's bytes over 12.5 GB/s plus NCCL's latency per hop; for 7e9
    parameters, the seed's 1.96 s. At the catalog's achieved 90% of line rate it is 1/0.9 longer."""
    from trainplan.estimate.time import step_derivation
    from trainplan.profile import load_profile

    line_rate = tmp_path / "line-rate.toml"
    line_rate.write_text("[efficiency]\nnic = 1.0\n")
    kw = dict(model="llama-2-7b", gpu="H100-SXM", gpus=8, gpus_per_node=1, nic_gbps=100, precision="fp16",
              zero=0, gbs=8)
    layout = resolve(make_plan(**kw))
    params = layout.model.params
    d = step_derivation(layout, load_profile(str(line_rate)))
    all_reduce = float(np.asarray(d["dp_collectives_s"]["all_reduce"]).ravel()[0])
    ring_latency = float(np.asarray(d["dp_call_latency_s"]["all_reduce"]).ravel()[0])
    assert ring_latency < 1e-3
    wire = all_reduce - ring_latency
    assert wire == pytest.approx(1.75 * params * 2 / 12.5e9, rel=1e-9)
    assert wire * 7e9 / params == pytest.approx(1.96, rel=1e-9)
    achieved = float(np.asarray(step_derivation(layout)["dp_collectives_s"]["all_reduce"]).ravel()[0])
    assert achieved - ring_latency == pytest.approx(wire / 0.9, rel=1e-9)


def test_napkin_1_11_carbon():
    """Seed 004, Napkin Math 1.11: 7B on 1T tokens (4.2e22 FLOPs) at 156 TFLOP/s per A100 on
    1,024 GPUs -> 3.04 days; (1,024 x 400 W + 128 hosts x 200 W) x 73 h = 31,784 kWh."""
    run = training_run(tokens=1e12, tokens_per_step=1.0, step_s=6 * 7e9 / (156e12 * 1024), gpus=1024,
                       price_per_gpu_hour=None, gpu_power_w=400, gpus_per_host=8, host_power_w=200, pue=1.0,
                       grid_kg_per_kwh=0.429)
    assert run["days"] == pytest.approx(3.04, abs=0.01)
    assert run["energy_kwh"] == pytest.approx(31784.2, rel=0.002)
    # the seed: halving the energy (15,892 kWh) avoids 6.8 t at the average grid
    assert run["co2_t"] / 2 == pytest.approx(6.8, rel=0.01)


def test_young_daly_goodput():
    """Young/Daly: tau = sqrt(2·delta·M); with delta = 60 s and M = 3 h, tau = 1,138 s and
    the lost share is delta/tau + tau/(2M) = 10.5%."""
    g = goodput(60.0, 3 * 3600.0)
    tau = np.sqrt(2 * 60 * 3 * 3600)
    assert float(g) == pytest.approx(1 - 60 / tau - tau / (2 * 3 * 3600))
    assert float(g) == pytest.approx(0.8946, abs=1e-3)


def test_plan_json_has_time_and_training_sections():
    data = to_json(evaluate(make_plan(model="llama-3-70b", gpus=64, tp=8, pp=4, gbs=128)))
    t, tr = data["time"], data["training"]
    assert set(t) >= {"step_s", "tokens_per_s", "tflops_per_gpu", "mfu", "bubble_fraction", "breakdown_s"}
    assert set(tr) >= {"tokens", "steps", "days", "gpu_hours", "cost_usd", "energy_kwh", "co2_t"}
    assert sum(t["breakdown_s"].values()) == pytest.approx(t["step_s"], rel=1e-9)
    assert tr["tokens"] == pytest.approx(20 * catalog.model("llama-3-70b").params)  # Chinchilla
    assert 0 < t["mfu"] < 1 and t["tokens_per_s"] == pytest.approx(128 * 4096 / t["step_s"])


def test_gpu_profile_changes_step_time(tmp_path):
    """A calibrated profile replaces the defaults: halving the GEMM efficiency slows the step."""
    base = evaluate(make_plan(model="llama-3-8b", gpus=8, tp=1, gbs=64)).time["step_s"]
    prof = tmp_path / "gpu.toml"
    prof.write_text("[efficiency]\ngemm = 0.4\n")
    slow = evaluate(make_plan(model="llama-3-8b", gpus=8, tp=1, gbs=64, gpu_profile=str(prof))).time["step_s"]
    assert slow > 1.5 * base
    prof.write_text("[efficiency]\ngemm = 7\n")
    from trainplan.errors import PlanError

    with pytest.raises(PlanError) as e:
        evaluate(make_plan(model="llama-3-8b", gpus=8, gpu_profile=str(prof)))
    assert e.value.field == "gpu_profile"


def test_interleaving_and_more_micro_batches_shrink_the_bubble():
    kw = dict(model="llama-3-70b", gpus=64, tp=8, pp=8)
    b1 = evaluate(make_plan(**kw, gbs=64)).time["bubble_fraction"]
    b2 = evaluate(make_plan(**kw, gbs=256)).time["bubble_fraction"]
    b3 = evaluate(make_plan(**kw, gbs=64, schedule="interleaved", vpp=2)).time["bubble_fraction"]
    assert b2 < b1 and b3 < b1
    lay = resolve(make_plan(**kw, gbs=64))
    assert lay.micro_batches == 64


def test_published_runs_table_is_complete():
    """Every published row (217, from fifteen tables: MosaicML's whole H100 and A100 tables hold the
    9 and 16 rows of their selections again) is turned into a plan and predicted."""
    from pathlib import Path

    from trainplan.calibration import rows

    data = rows(Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "published_runs.toml")
    assert len(data) == 217
    assert {r["source"] for r in data} == {"narayanan2021", "megatron_core_h100", "megatron_single_node", "mosaicml_h100",
                                           "mosaicml_h100_full", "mosaicml_h100_large", "mosaicml_h100_fp8", "mosaicml_a100", "mosaicml_a100_full",
                                           "llama3_405b", "automodel_h100", "bloom_176b", "opt_175b",
                                           "deepspeed_azure_zero3", "torchtitan_h100"}
    assert all(np.isfinite(r["predicted"]) and r["predicted"] > 0 for r in data)


def test_time_model_bulk_equals_scalar():
    """DESIGN §2, one formula: the step time of many layouts evaluated at once (arrays, the
    stage axis padded with empty stages) equals each layout's own evaluation exactly."""
    from trainplan.estimate import activations as act
    from trainplan.estimate.flops import step_flops
    from trainplan.estimate.hardware import hardware
    from trainplan.estimate.memory import estimate_memory
    from trainplan.estimate.pipeline import SCHEDULE_CODE
    from trainplan.estimate.recipe import recipe
    from trainplan.estimate.time import step_time, step_time_core

    rng = np.random.default_rng(0)
    layouts = []
    while len(layouts) < 24:
        tp, pp = int(rng.choice([1, 2, 4, 8])), int(rng.choice([1, 2, 4, 8]))
        dp = int(rng.choice([1, 2, 4, 16]))
        kw = dict(model="llama-3-70b", gpus=tp * pp * dp, tp=tp, pp=pp, zero=int(rng.integers(0, 4)),
                  mbs=int(rng.choice([1, 2])), recompute=str(rng.choice(["none", "selective", "full"])),
                  attention=str(rng.choice(["flash", "eager"])), overlap_tp=bool(rng.integers(0, 2)),
                  sp=tp > 1 and bool(rng.integers(0, 2)),
                  gbs=tp * 0 + dp * 2 * 8 * (1 if pp == 1 else pp))
        layouts.append(resolve(make_plan(**kw)))
    scalar = np.array([step_time(lay)["step_s"] for lay in layouts])
    S = max(lay.pp for lay in layouts)
    pad = lambda xs: np.array([list(x) + [0] * (S - len(x)) for x in xs], dtype=float)  # noqa: E731
    col = lambda f: np.array([f(lay) for lay in layouts], dtype=float)[:, None]  # noqa: E731
    lay0 = layouts[0]
    fl = [step_flops(lay.model, tokens=lay.gbs * lay.seq_len, seq=lay.seq_len, dense_layers=lay.model.layers,
                     moe_layers=0, head=1, attention_eager=lay.plan.attention == "eager",
                     recompute=act.RECOMPUTE_CODE[lay.plan.recompute], vocab_padded=lay.model.vocab) for lay in layouts]
    bulk = step_time_core(
        lay0.model, hardware(lay0), recipe(lay0.plan),
        tp=col(lambda x: x.tp), pp=col(lambda x: x.pp), dp=col(lambda x: x.dp), cp=col(lambda x: x.cp),
        ep=col(lambda x: x.ep), zero=col(lambda x: x.zero), mbs=col(lambda x: x.mbs), seq=col(lambda x: x.seq_len),
        m=col(lambda x: x.micro_batches), vpp=col(lambda x: x.vpp),
        schedule=col(lambda x: SCHEDULE_CODE[x.plan.schedule]),
        recompute=col(lambda x: act.RECOMPUTE_CODE[x.plan.recompute]),
        eager=col(lambda x: x.plan.attention == "eager"), dropout=0.0,
        overlap_tp=col(lambda x: x.plan.overlap_tp), overlap_dp=True, offload_optimizer=False, gpn=8,
        stage_dense=pad([x.stage_dense_layers for x in layouts]), stage_moe=pad([x.stage_moe_layers for x in layouts]),
        first=pad([[1] + [0] * (x.pp - 1) for x in layouts]), last=pad([[0] * (x.pp - 1) + [1] for x in layouts]),
        total_dense=col(lambda x: sum(x.stage_dense_layers)), total_moe=0.0, vocab_padded=lay0.vocab_padded,
        trainable=col(lambda x: float(np.max(estimate_memory(x)["trainable_params"]))),
        gbs=col(lambda x: x.gbs), gpus=col(lambda x: x.gpus),
        model_flops=np.array([float(f["model"]) for f in fl])[:, None],
        hw_flops=np.array([float(f["hardware"]) for f in fl])[:, None], sp=col(lambda x: x.sp))
    assert any(lay.sp for lay in layouts) and not all(lay.sp for lay in layouts if lay.tp > 1)
    assert np.asarray(bulk["step_s"])[:, 0] == pytest.approx(scalar, rel=1e-12)


def test_gemm_time_per_distinct_shape_equals_direct():
    """Timing each distinct (tokens, tp, ep) once and gathering gives exactly what timing every
    layout does (the dedup, and the memo for a single layout, are only speed-ups)."""
    from trainplan.estimate.gemm_rates import _layer_gemm_time, layer_gemm_time, layer_gemms
    from trainplan.plan import load_model, make_plan

    model = load_model(make_plan(model="mixtral-8x7b", gpus=8))
    rng = np.random.default_rng(0)
    tokens = rng.choice([1024.0, 2048.0, 4096.0, 3000.0], size=(5000, 1))
    tp = rng.choice([1.0, 2.0, 4.0, 8.0], size=(5000, 1))
    ep = rng.choice([1.0, 8.0], size=(5000, 1))
    for moe in (False, True):
        g = layer_gemms(model, moe)
        args = (8, 2, 989e12, 0.8, 132, 2)
        fast = layer_gemm_time(g, tokens, tp, ep, *args)
        assert fast.shape == (5000, 1)
        assert np.array_equal(fast, _layer_gemm_time(g, tokens, tp, ep, *args))
        # one layout (scalars) is memoised: the same value, first call and repeated
        for _ in range(2):
            one = layer_gemm_time(g, np.asarray(tokens[7, 0]), np.asarray(tp[7, 0]), np.asarray(ep[7, 0]), *args)
            assert np.shape(one) == () and one == fast[7, 0]


def test_published_rows_take_a_calibrated_profile_for_their_accelerator_only(tmp_path):
    """`rows(profiles=)`: a profile for H100-SXM changes the H100 rows' predictions (here a
    GEMM fraction half the catalog's MAMF, so each H100 row slows down) and no other row, not
    even torchtitan's, which ran on another part (H100-SXM-96GB)."""
    from pathlib import Path

    from trainplan.calibration import rows

    profile = tmp_path / "h100.toml"
    profile.write_text("[efficiency]\ngemm = 0.4015\n")  # half of H100's MAMF fraction 0.803
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "published_runs.toml"
    default, calibrated = rows(path), rows(path, {"H100-SXM": str(profile)})
    h100 = {"megatron_core_h100", "mosaicml_h100", "mosaicml_h100_full", "mosaicml_h100_large", "mosaicml_h100_fp8",
            "llama3_405b", "automodel_h100"}
    for d, c in zip(default, calibrated, strict=True):
        if d["source"] in h100:
            assert c["predicted"] < 0.95 * d["predicted"]  # attention-bound long sequences slow least (0.90)
        else:
            assert c["predicted"] == d["predicted"]


def test_sequence_parallelism_shards_the_element_wise_work():
    """Korthikanti et al. 2022 §4.2.2: with SP the norms and residual adds (10h element passes
    per token and layer here) run on s/t tokens; nothing else in the step changes. Llama-3-8B,
    TP 8, 8 micro-batches of 4,096 tokens: the compute time falls by exactly
    m · L · 3 (forward + backward) · tokens · 10h · (1 - 1/t) · 2 B / HBM bandwidth."""
    from trainplan.estimate.hardware import hardware

    kw = dict(model="llama-3-8b", gpu="H100-SXM", gpus=8, tp=8, gbs=8, mbs=1, seq_len=4096)
    off, on = (evaluate(make_plan(**kw, sp=sp)).time for sp in (False, True))
    hbm = hardware(resolve(make_plan(**kw))).hbm
    saved = 8 * 32 * 3 * 4096 * 10 * 4096 * (1 - 1 / 8) * 2 / hbm
    assert off["breakdown_s"]["compute"] - on["breakdown_s"]["compute"] == pytest.approx(saved, rel=1e-9)
    assert off["breakdown_s"]["tp_comm"] == on["breakdown_s"]["tp_comm"]


def test_flash_attention_efficiency_follows_sequence_length(tmp_path):
    """H100 FlashAttention-2, causal, head dim 128 (Shah et al. 2024 Figs. 5-6, catalog curve):
    28.4% of peak at 4k, 14.7% at 512, 30.6% from 16k on; log-interpolated between lengths; a
    context-parallel call spans s/cp. Accelerators without a curve keep one figure (B200: the
    default 55%); a profile's measured figure or curve replaces the catalog's."""
    from trainplan.estimate.attention_rates import flash_efficiency
    from trainplan.estimate.hardware import hardware

    h100 = hardware(resolve(make_plan(model="llama-3-8b", gpu="H100-SXM", gpus=8)))
    assert flash_efficiency(h100, np.array([512, 4096, 16384, 65536])) == pytest.approx([0.147, 0.284, 0.306, 0.306])
    assert flash_efficiency(h100, 2048 * 2 ** 0.5) == pytest.approx((0.256 + 0.284) / 2)
    b200 = hardware(resolve(make_plan(model="llama-3-8b", gpu="B200", gpus=8)))
    assert flash_efficiency(b200, 512) == flash_efficiency(b200, 16384) == pytest.approx(0.55)

    # 32K tokens over cp 8 run 4K-token calls: the step equals one with the 4K figure throughout
    at_4k = tmp_path / "at4k.toml"
    at_4k.write_text("[efficiency]\nflash = 0.284\n")
    kw = dict(model="llama-3-8b", gpu="H100-SXM", gpus=8, gbs=8, tp=1, pp=1, zero=3, seq_len=32768, cp=8)
    assert evaluate(make_plan(**kw)).time["step_s"] == \
        pytest.approx(evaluate(make_plan(**kw, gpu_profile=str(at_4k))).time["step_s"], rel=1e-12)
    scalar = tmp_path / "scalar.toml"
    scalar.write_text("[efficiency]\nflash = 0.5\n")
    measured = tmp_path / "curve.toml"
    measured.write_text("[efficiency]\nflash = 0.5\n[flash_curve]\nseq = [1024, 8192]\nfraction = [0.2, 0.4]\n")
    from trainplan.profile import load_profile

    plan = resolve(make_plan(model="llama-3-8b", gpu="H100-SXM", gpus=8))
    assert flash_efficiency(hardware(plan, load_profile(str(scalar))), 512) == 0.5
    assert flash_efficiency(hardware(plan, load_profile(str(measured))), np.array([512, 2896, 16384])) == \
        pytest.approx([0.2, 0.3, 0.4], abs=1e-4)


def test_flash_attention_pays_for_padded_head_dims():
    """FA2 is compiled for head dims in multiples of 32 (flash_api.cpp round_multiple(head_size,
    32)): head dim 112 (7168 / 64 heads) runs as 128, 80 as 96; the Triton kernel's tiles span
    the next power of two (flash_attn_triton.py BLOCK_HEADDIM): 80 runs as 128. Same width,
    same FLOPs: 64 heads of 112 are slower than 56 heads of 128 (what MPT-30B's benchmark yaml
    uses) under both kernels."""
    from trainplan.estimate.attention_rates import flash_head_dim

    assert flash_head_dim(np.array([64, 80, 112, 128, 192]), "flash", 32).tolist() == [64, 96, 128, 128, 192]
    assert flash_head_dim(np.array([8, 64, 80, 112, 128]), "triton", 32).tolist() == [16, 64, 128, 128, 128]

    def step(heads, attention):
        mpt = ModelSpec(name=f"mpt-{heads}h", source="test", layers=4, hidden=7168, heads=heads, ffn=4 * 7168,
                        mlp="gelu", vocab=50368, tied_embeddings=True, norm="layernorm", position="learned",
                        max_position=8192, fused_qkv=True)
        plan = make_plan(gpu="H100-SXM", gpus=8, zero=3, gbs=8, seq_len=8192, recompute="none", attention=attention)
        return evaluate(plan, spec=mpt).time["step_s"]

    assert step(64, "flash") > step(56, "flash") * 1.005
    assert step(64, "triton") > step(56, "triton") * 1.005
    assert step(56, "triton") > step(56, "flash")  # the Triton kernel is the slower one


def test_triton_attention_keeps_what_flash_attention_keeps():
    """Both fused kernels save the output and the log-sum-exp, never the s² scores."""
    kw = dict(model="llama-3-8b", gpu="A100-80GB-SXM", gpus=8, seq_len=8192, recompute="none")
    flash, triton = (evaluate(make_plan(**kw, attention=a)).memory for a in ("flash", "triton"))
    assert np.max(triton["total"]) == np.max(flash["total"]) > 0


def test_overlapped_data_parallel_collectives_slow_the_compute_they_overlap():
    """Overlap is not free (arXiv 2507.03114: compute beside NCCL collectives runs 18.9% slower
    on average): a collective hidden behind compute adds 18.9% of its own time; one longer
    than the compute adds what outlasts it plus 18.9% of the compute. For a ZeRO-3 step the
    data-parallel part is exactly m x that for each micro-batch's gathers and scatter, but for
    the first unit's gather, which has no compute before it to hide behind (time.zero3_exposed)."""
    from trainplan.estimate.collectives import overlapped

    assert overlapped(1.0, 3.0, 0.189) == pytest.approx(0.189)
    assert overlapped(3.0, 1.0, 0.189) == pytest.approx(2.189)
    from trainplan.estimate.time import step_derivation

    kw = dict(model="llama-3-8b", gpu="H100-SXM", gpus=16, zero=3, gbs=64, mbs=2, seq_len=4096)
    on = evaluate(make_plan(**kw)).time
    off = evaluate(make_plan(**kw, overlap_dp=False)).time
    # DeepSpeed's own passes over the gradients run on the compute stream either way
    book = float(np.asarray(step_derivation(resolve(make_plan(**kw)))["dp_bookkeeping_s"]).ravel()[0])
    assert book > 0
    m = 64 // (16 * 2)
    per_mb_comm = (off["breakdown_s"]["dp_comm"] - book) / m
    compute = on["micro_batch_s"]["compute"]
    assert per_mb_comm < compute  # hidden: only the slowdown shows
    d = step_derivation(resolve(make_plan(**kw)))
    first = float(np.asarray(d["dp_collectives_s"]["all_gather"]).ravel()[0]) / (32 + 1)  # 32 layers, the root
    assert on["breakdown_s"]["dp_comm"] - book == pytest.approx(m * (0.189 * per_mb_comm + 0.811 * first), rel=1e-9)


def test_all_gather_context_parallelism_exposes_its_exchange():
    """Llama 3's context parallelism (Dubey et al. 2024 §3.3.2) all-gathers K/V before attention,
    "exposed in the critical path", and reduce-scatters their gradients after it: per layer and
    micro-batch, 2 collectives of the K/V all-gather's time (3 with a recomputed forward). The
    ring passes the same bytes while attention runs, hidden at 64K tokens."""
    from trainplan.estimate.collectives import link
    from trainplan.estimate.hardware import hardware

    kw = dict(model="llama-3-8b", gpu="H100-SXM", gpus=16, cp=16, seq_len=65536, gbs=1)
    ring, gathered = (evaluate(make_plan(**kw, cp_comm=c)).time for c in ("ring", "allgather"))
    assert ring["breakdown_s"]["cp_comm"] == 0.0
    lay = resolve(make_plan(**kw))
    hw = hardware(lay)
    m = lay.model
    kv = (65536 / 16) * 2 * m.kv_dim * 2 * 16  # every rank's K and V, bf16, gathered
    ag = comm.collective_time(comm.ALL_GATHER, kv, 16, comm.group_busbw(16, 1, 8, hw.nvlink, hw.nic),
                              link(hw, comm.ALL_GATHER, 16, 1, 8)[1])
    assert gathered["breakdown_s"]["cp_comm"] == pytest.approx(m.layers * 2 * ag, rel=1e-9)
    assert gathered["step_s"] > ring["step_s"]


def test_fused_loss_moves_and_keeps_fewer_bytes_per_logit():
    """PyTorch's cross-entropy makes 3 passes over an fp32 copy of the logits (12 bytes per
    logit forward, twice that backward) and keeps fp32 log-probabilities plus an 8-byte
    workspace; a fused loss reads the bf16 logits once (2 bytes), keeps them (2) and writes a
    bf16 gradient (2). One stage, one micro-batch: the step and the memory differ by exactly
    that, times tokens x vocabulary."""
    from trainplan.estimate.hardware import hardware
    from trainplan.estimate.memory import estimate_memory

    kw = dict(model="llama-3-8b", gpu="H100-SXM", gpus=8, zero=3, gbs=8, seq_len=4096)
    plain, fused = (evaluate(make_plan(**kw, fused_loss=f)) for f in (False, True))
    lay = resolve(make_plan(**kw))
    logits = 4096 * lay.vocab_padded
    hbm = hardware(lay).hbm
    assert plain.time["breakdown_s"]["compute"] - fused.time["breakdown_s"]["compute"] == \
        pytest.approx(3 * logits * (12 - 2) / hbm, rel=1e-9)
    mem = {f: estimate_memory(resolve(make_plan(**kw, fused_loss=f))) for f in (False, True)}
    assert np.max(mem[False]["head_terms"]["logits"] - mem[True]["head_terms"]["logits"]) == logits * (4 - 2)
    assert np.max(mem[False]["loss_workspace"] - mem[True]["loss_workspace"]) == logits * (8 - 2)


def test_bf16_gradient_reduction_halves_the_reduce_scatter_only():
    """FSDP2 reduce-scatters fp32 gradients by default (MixedPrecisionPolicy reduce_dtype);
    reduce_dtype bf16 (Composer's FSDP mixed precision before October 2023, DeepSpeed's
    communication_data_type) saves 2 bytes per gradient element on the wire. Llama 3 8B, ZeRO-3
    over 16 H100s on two nodes, nothing overlapped: the saving is m x (n-1)/n x 2 x P bytes at the
    group's bus bandwidth, 8 NICs x 400 Gb/s x 0.90 = 360 GB/s (= NVLink's 450 x 0.80), plus
    FSDP2's copy of the gradients into the reduce-scatter buffer, a read and a write priced in
    the reduce dtype: m x 2 x 2 x P bytes at 3.35 TB/s x 0.88; the parameter all-gathers and
    the sharded fp32 gradients in memory do not change."""
    kw = dict(model="llama-3-8b", gpu="H100-SXM", gpus=16, zero=3, gbs=64, mbs=2, seq_len=4096,
              framework="fsdp", overlap_dp=False)
    fp32, bf16 = evaluate(make_plan(**kw)), evaluate(make_plan(**kw, reduce_dtype="bf16"))
    m, params = 64 // (16 * 2), fp32.layout.model.params
    saved = fp32.time["breakdown_s"]["dp_comm"] - bf16.time["breakdown_s"]["dp_comm"]
    assert saved == pytest.approx(m * 15 / 16 * 2 * params / 360e9 + m * 2 * 2 * params / (3.35e12 * 0.88),
                                  rel=1e-9)
    assert np.all(bf16.memory["grads"] == fp32.memory["grads"])


def test_early_stop_recompute_skips_the_down_projections():
    """Full recompute under a non-reentrant checkpoint (FSDP2/torchtitan's, PyTorch >= 2.1)
    stops before each dense block's MLP down projection (measured: tests/test_validate.py):
    Llama 3 8B's hardware FLOPs per step drop by tokens x 2 x ffn x hidden x layers and the
    compute by that GEMM's time per layer and micro-batch; a dropout after the down projection
    saves a mask there, so with dropout the whole block is re-run."""
    from trainplan.estimate.gemm_rates import last_linear_time, layer_gemms
    from trainplan.estimate.hardware import hardware
    from trainplan.estimate.recipe import recipe

    kw = dict(model="llama-3-8b", gpu="H100-SXM", gpus=8, zero=3, gbs=16, mbs=1, seq_len=4096,
              framework="fsdp", recompute="full")
    early, whole = evaluate(make_plan(**kw)), evaluate(make_plan(**kw, recompute_early_stop=False))
    spec, tokens = early.layout.model, 16 * 4096
    assert recipe(early.layout.plan).recompute_skips_last_linear and not recipe(whole.layout.plan).recompute_skips_last_linear
    saved = whole.time["hardware_flops_per_step"] - early.time["hardware_flops_per_step"]
    assert saved == pytest.approx(tokens * 2 * spec.ffn * spec.hidden * spec.layers, rel=1e-12)
    hw = hardware(early.layout)
    t_down = last_linear_time(layer_gemms(spec, False), 4096, 1, hw.gemm_peak, hw.gemm_eff, hw.sms, 2, hw.gemm_curve)
    m = early.layout.micro_batches
    assert whole.time["breakdown_s"]["compute"] - early.time["breakdown_s"]["compute"] == pytest.approx(
        m * spec.layers * float(t_down), rel=1e-9)
    dropped = [evaluate(make_plan(**kw, dropout=0.1, recompute_early_stop=flag)).time for flag in (True, False)]
    assert dropped[0]["hardware_flops_per_step"] == dropped[1]["hardware_flops_per_step"]


def test_options_that_change_nothing_say_so():
    """--recompute-early-stop without full recompute, or with dropout, and --reduce-dtype
    without data parallelism change nothing; the plan says why instead of staying silent."""
    lay = resolve(make_plan(model="llama-3-8b", gpus=1, recompute_early_stop=True, reduce_dtype="bf16"))
    assert any("only full recomputation" in w for w in lay.warnings)
    assert any("dp x cp = 1" in w for w in lay.warnings)
    lay = resolve(make_plan(model="llama-3-8b", gpus=1, recompute="full", dropout=0.1, recompute_early_stop=True))
    assert any("dropout mask" in w for w in lay.warnings)
    assert not resolve(make_plan(model="llama-3-8b", gpus=8, zero=3, recompute="full", framework="fsdp")).warnings


def test_backward_prefetch_after_the_gradients_exposes_the_gather():
    """PyTorch FSDP's BackwardPrefetch: BACKWARD_PRE gathers the next layer before the current
    layer's gradients (overlapped); BACKWARD_POST after them, so the gather waits in the open
    while only the reduce-scatter overlaps the next layer; no prefetch leaves both in the open.
    Llama 3 8B, ZeRO-3 over 16 H100s (two nodes, 360 GB/s bus bandwidth; one call per layer and
    one for the root, 33 calls of NCCL's ring latency over 16 ranks on 2 nodes, 8.4 + 14 x 3.4 +
    14.0 = 70 us each), compute long enough to hide the rest: per micro-batch, post costs
    (1 - 0.189) x one parameter gather more than pre, and none another (1 - 0.189) x the
    reduce-scatter."""
    kw = dict(model="llama-3-8b", gpu="H100-SXM", gpus=16, zero=3, gbs=64, mbs=2, seq_len=4096, framework="fsdp")
    dp = {mode: evaluate(make_plan(**kw, backward_prefetch=mode)).time["breakdown_s"]["dp_comm"]
          for mode in ("pre", "post", "none")}
    params, m = resolve(make_plan(**kw)).model.params, 64 // (16 * 2)
    latency = 33 * (8.4 + 14 * 3.4 + 14.0) * 1e-6
    gather = float(comm.collective_time(comm.ALL_GATHER, 2 * params, 16, 360e9, latency))
    scatter = float(comm.collective_time(comm.REDUCE_SCATTER, 4 * params, 16, 360e9, latency))
    assert dp["post"] - dp["pre"] == pytest.approx(m * (1 - 0.189) * gather, rel=1e-9)
    assert dp["none"] - dp["post"] == pytest.approx(m * (1 - 0.189) * scatter, rel=1e-9)
    assert any("only ZeRO-3" in w for w in resolve(make_plan(**{**kw, "zero": 2}, backward_prefetch="post")).warnings)


def test_megatron_cross_entropy_moves_its_own_bytes_per_logit():
    """Megatron-LM's vocabulary-parallel cross-entropy (tensor_parallel/cross_entropy.py, not
    fused) passes over an fp32 copy of the logits six times forward (cast, max, subtract, exp,
    sum, divide: 38 bytes per logit) and twice backward (scale, cast back: 14); a fused loss
    moves 2 + 4. One stage, one micro-batch: the compute differs by exactly 46 bytes per logit."""
    from trainplan.estimate.hardware import hardware

    kw = dict(model="llama-3-8b", gpu="H100-SXM", gpus=8, zero=1, gbs=8, seq_len=4096, framework="megatron")
    plain, fused = (evaluate(make_plan(**kw, fused_loss=f)) for f in (False, True))
    lay = resolve(make_plan(**kw))
    logits = 4096 * lay.vocab_padded
    assert plain.time["breakdown_s"]["compute"] - fused.time["breakdown_s"]["compute"] == \
        pytest.approx(logits * (38 + 14 - 2 - 4) / hardware(lay).hbm, rel=1e-9)


def test_explain_derives_the_step_from_its_parts():
    """`plan --explain` shows the step from its parts: per layer, the forward, backward and
    recomputed GEMMs, attention and element-wise work; times the stage's layers, plus the head
    and the embedding, the micro-batch's compute; then pipeline + exposed data-parallel time +
    optimizer + waiting for data = the step. Llama 3 70B, TP 8 PP 4, selective recompute."""
    from trainplan.estimate.time import step_derivation
    from trainplan.explain import explain_time_lines

    res = evaluate(make_plan(model="llama-3-70b", gpus=64, tp=8, pp=4, zero=1, sp=True, recompute="selective",
                             gbs=256))
    d = step_derivation(res.layout, None, res.memory)
    i = int(np.argmax(d["stage_s"]))
    at = lambda a: float(np.broadcast_to(np.asarray(a, dtype=float), (4,))[i])  # noqa: E731
    layer = d["detail"]["layer"]["dense"]
    parts = ("gemm_forward", "gemm_backward", "attention_forward", "attention_backward", "elementwise_forward",
             "elementwise_backward", "recompute")
    assert sum(at(layer[k]) for k in parts) == pytest.approx(at(layer["total"]), rel=1e-12)
    assert at(layer["recompute"]) == pytest.approx(at(layer["attention_forward"]), rel=1e-12)  # selective
    compute = (at(layer["total"]) * res.layout.stage_dense_layers[i] + (i == 3) * at(d["detail"]["head"])
               + (i == 0) * at(d["detail"]["embedding"]))
    assert compute == pytest.approx(float(np.ravel(d["micro_batch_s"]["compute"])[0]), rel=1e-12)
    bd = res.time["breakdown_s"]
    assert float(np.ravel(d["pipeline_s"])[0]) + bd["dp_comm"] + bd["optimizer"] + bd["data"] == \
        pytest.approx(res.time["step_s"], rel=1e-12)
    lines = explain_time_lines(res)
    assert lines[0].startswith(f"Time of one micro-batch on stage {i} of 4")
    assert lines[-1].endswith(f"= step {res.time['step_s']:.3f} s")


def test_flash_attention_on_a_pre_ampere_gpu_is_flagged():
    """FlashAttention-2 (and its Triton kernel) builds for Ampere and newer; a V100 plan that
    asks for it is warned, with the alternatives; an A100 plan is not."""
    lay = resolve(make_plan(model="gpt2-xl", gpu="V100", gpus=1, precision="fp32"))
    assert [w["code"] for w in lay.warning_details] == ["flash_needs_ampere"]
    assert not resolve(make_plan(model="gpt2-xl", gpu="V100", gpus=1, precision="fp32", attention="eager")).warnings
    assert not resolve(make_plan(model="gpt2-xl", gpu="A100-80GB-SXM", gpus=1)).warnings


def _h100_matmul_table():
    import tomllib
    from pathlib import Path

    data = tomllib.loads((Path(__file__).parents[1] / "benchmarks/data/h100_matmul_xla.toml").read_text())
    m, n, k, tflops = np.array(data["rows"], dtype=float).T
    return m, n, k, 2 * m * n * k / (tflops * 1e12)


def test_h100_gemm_shape_fit_is_the_catalogs_and_reproduces_the_measured_table():
    """OpenXLA's measured H100 bf16 matmul table (39 shapes, 1024 x 1024 x 256 to 4096^3):
    the catalog's fitted main loop, write-back and kernel time are its least-squares fit, and
    the time model, at training ratio 1, prices every shape within 10% (1.7% on average); the
    former datasheet model (MAMF x tile and wave quantization) missed the shapes of 1024 and
    more by 29% on average and priced short inner dimensions up to 3.7x too fast."""
    from trainplan.estimate.gemm_rates import _gemm_time
    from trainplan.estimate.gemm_shape import fit_gemm_shape
    from trainplan.estimate.hardware import hardware
    from trainplan.plan import conventions

    m, n, k, seconds = _h100_matmul_table()
    peak = catalog.gpu("H100-SXM").peak("bf16")
    fit = fit_gemm_shape(m, n, k, seconds, peak)
    shape = conventions()["efficiency"]["gemm_shape"]["H100-SXM"]
    assert shape["mainloop"] == pytest.approx(fit["mainloop"], abs=5e-4)
    assert shape["k0"] == pytest.approx(fit["k0"], abs=0.5)
    assert shape["overhead_us"] == pytest.approx(fit["overhead_us"], abs=0.05)
    assert (fit["mean_error"], fit["worst_error"]) == pytest.approx((0.0174, 0.0990), abs=0.0005)
    hw = hardware(resolve(make_plan(model="llama-3-8b", gpu="H100-SXM", gpus=8)))
    predicted = _gemm_time(m, n, k, 1, hw.gemm_peak, shape["mainloop"], hw.sms, 2, hw.gemm_curve)
    error = np.abs(predicted / seconds - 1)
    assert error.mean() < 0.02 and error.max() < 0.10
    # the write-back share: m = n = 4096 at k = 512 runs at 543 TFLOP/s against 783 at k = 4096
    at = lambda kk: 2 * 4096 * 4096 * kk / _gemm_time(4096, 4096, kk, 1, hw.gemm_peak, shape["mainloop"],  # noqa: E731
                                                       hw.sms, 2, hw.gemm_curve) / 1e12
    assert at(512) / at(4096) == pytest.approx(543.1 / 783.3, rel=0.05)


def test_gemm_shape_fit_applies_to_hopper_and_yields_to_a_measured_profile(tmp_path):
    """The fitted shape terms price Hopper GEMMs (H100, H200, H800) unless a calibrated profile
    measured GEMMs on the machine; other accelerators keep tile and wave quantization."""
    from trainplan.estimate.gemm_shape import GemmShape
    from trainplan.estimate.hardware import hardware
    from trainplan.profile import load_profile

    def curve(gpu, profile=None):
        layout = resolve(make_plan(model="llama-3-8b", gpu=gpu, gpus=8))
        return hardware(layout, profile).gemm_curve

    assert all(isinstance(curve(g), GemmShape) for g in ("H100-SXM", "H200-SXM", "H800-SXM"))
    assert curve("A100-80GB-SXM") is None
    path = tmp_path / "h100.toml"
    path.write_text("[efficiency]\ngemm = 0.80\n")
    assert curve("H100-SXM", load_profile(str(path))) is None
    # fp8 doubles the main loop's rate, so the same write-back costs twice the inner steps
    fp8 = hardware(resolve(make_plan(model="llama-3-8b", gpu="H100-SXM", gpus=8, precision="fp8")))
    assert fp8.gemm_curve.k0 == pytest.approx(2 * curve("H100-SXM").k0, rel=0.01)


def test_fp8_gemms_reach_the_published_share_of_the_fp8_peak():
    """Measured best-shape matmuls (MLE-A MAMF): H100 fp8 1402.6 of 1979 TFLOP/s (70.9%)
    against bf16 80.3%; an fp8 plan's GEMM efficiency is the bf16 one times 0.709 / 0.803, so
    its GEMMs run 1.76x, not 2x, the bf16 speed. Accelerators without a published fp8 figure
    keep the bf16 share."""
    from trainplan.estimate.hardware import hardware

    def hw(gpu, precision):
        return hardware(resolve(make_plan(model="llama-3-8b", gpu=gpu, gpus=8, precision=precision)))

    bf16, fp8 = hw("H100-SXM", "bf16"), hw("H100-SXM", "fp8")
    assert fp8.gemm_eff / bf16.gemm_eff == pytest.approx(0.709 / 0.803)
    assert fp8.gemm_peak * fp8.gemm_eff / (bf16.gemm_peak * bf16.gemm_eff) == pytest.approx(1979 / 989 * 0.883, rel=1e-3)
    assert hw("B200", "fp8").gemm_eff / hw("B200", "bf16").gemm_eff == pytest.approx(0.763 / 0.776)


def test_hopper_attention_forward_and_recompute_take_the_published_forward_speed():
    """Shah et al. 2024 (Figs. 5-6, H100, causal, head dim 128, 4k tokens) give FA2's forward
    alone, 319 TFLOP/s, and forward + backward, 281: a forward, and the attention forward a
    selective recompute re-runs, take 319; the backward the rest of the same total. cuDNN:
    518 forward, 447.5 forward + backward. Llama 3 8B, 4,096 tokens: 2 x 4096^2/2 x 32 heads
    x 2 x 128 FLOPs per layer forward."""
    from trainplan.estimate.time import step_derivation

    flops = 0.5 * 4096 * 4096 * 32 * 2 * 256
    for attention, forward, total in (("flash", 319, 281), ("cudnn", 518, 447.5)):
        layout = resolve(make_plan(model="llama-3-8b", gpu="H100-SXM", gpus=8, recompute="selective",
                                   attention=attention))
        layer = step_derivation(layout)["detail"]["layer"]["dense"]
        assert float(layer["attention_forward"]) == pytest.approx(flops / (forward * 1e12), rel=0.005)
        assert float(layer["recompute"]) == float(layer["attention_forward"])
        assert float(layer["attention_forward"] + layer["attention_backward"]) == pytest.approx(
            3.5 * flops / (total * 1e12), rel=0.005)


def test_collective_latency_is_nccls_ring_model():
    """A call's latency follows NCCL's own model of its ring (src/graph/tuning.cc, Simple
    protocol): 8.4 us + 3.4 us per hop inside a node + 14.0 us per hop between nodes. An
    all-gather over 512 GPUs on 64 nodes takes 511 hops, 63 between nodes: 2.41 ms; over the 8
    GPUs of one node 32.2 us; an all-reduce goes round twice; a send/recv is one hop."""
    from trainplan.estimate.collectives import link
    from trainplan.estimate.hardware import hardware

    hw = hardware(resolve(make_plan(model="llama-3-8b", gpu="H100-SXM", gpus=8)))
    assert hw.latency == pytest.approx((8.4e-6, 3.4e-6, 14.0e-6, 23e-6, 14e-6))
    assert link(hw, comm.ALL_GATHER, 512, 1, 8)[1] == pytest.approx((8.4 + 448 * 3.4 + 63 * 14.0) * 1e-6)
    assert link(hw, comm.ALL_GATHER, 512, 1, 8)[1] == pytest.approx(2.4136e-3, rel=1e-4)
    assert link(hw, comm.REDUCE_SCATTER, 8, 1, 8)[1] == pytest.approx(32.2e-6)
    assert link(hw, comm.ALL_REDUCE, 8, 1, 8)[1] == pytest.approx((8.4 + 14 * 3.4) * 1e-6)
    # one rank per node (data parallelism beside TP 8): every hop crosses the network
    assert link(hw, comm.ALL_GATHER, 48, 8, 8)[1] == pytest.approx((8.4 + 47 * 14.0) * 1e-6)
    assert link(hw, comm.SEND_RECV, 2, 64, 8)[1] == pytest.approx((8.4 + 14.0) * 1e-6)
    assert comm.group_nodes(np.array([8, 16, 48, 512]), np.array([1, 1, 8, 1]), 8).tolist() == [1, 2, 48, 64]
    # done in the network (--sharp), an all-reduce is NCCL's NVLS: one 23 us step in a node, and
    # its NVLS tree across nodes, 2 log2(nodes) network steps more (64 nodes: 23 + 12 x 14 us)
    assert link(hw, comm.ALL_REDUCE, 8, 1, 8, sharp=True)[1] == pytest.approx(23e-6)
    assert link(hw, comm.ALL_REDUCE, 512, 1, 8, sharp=True)[1] == pytest.approx((23 + 12 * 14) * 1e-6)
    assert link(hw, comm.ALL_GATHER, 8, 1, 8, sharp=True)[1] == link(hw, comm.ALL_GATHER, 8, 1, 8)[1]
    # `plan --explain` shows the latency the step paid: NVLS over 64 GPUs on 8 nodes, 23 + 6 x 14 us
    from trainplan.explain import explain_time_lines

    lines = explain_time_lines(evaluate(make_plan(model="llama-3-8b", gpu="H100-SXM", gpus=64, sharp=True)))
    assert "each collective one call of 0.107 ms NCCL latency" in lines[-2]


def test_the_plan_gives_its_own_links_and_needs_those_it_crosses():
    """--scale-up-gbs / --nic-gbps replace the catalog's links: the network a plan's collectives
    cross between nodes is the one it names (H100 nodes with 2 x 400G per 8 GPUs: 100 Gb/s per GPU,
    a quarter of the DGX's, at the same achieved fraction). A plan over links the catalog does not
    give (RTX 4090: no network; TPU v4: no figure for ICI) is refused by name until it gives them;
    it used to be timed over a made-up link (PCIe across nodes) or come out NaN."""
    from trainplan.estimate.hardware import hardware

    kw = dict(model="llama-3-8b", gpus=16, zero=3, framework="fsdp", gbs=64)
    dgx, thin = resolve(make_plan(**kw)), resolve(make_plan(**kw, nic_gbps=100))
    assert hardware(thin).nic == pytest.approx(hardware(dgx).nic / 4, rel=1e-12)
    assert hardware(thin).nvlink == hardware(dgx).nvlink
    slow, fast = evaluate(make_plan(**kw, nic_gbps=100)).time, evaluate(make_plan(**kw)).time
    assert slow["breakdown_s"]["dp_comm"] > fast["breakdown_s"]["dp_comm"]
    assert to_json(evaluate(make_plan(**kw, nic_gbps=100)))["gpu"]["nic_gbps"] == 100
    # `--explain` names the bus bandwidth: 8 ranks a node, one NIC each at 90% of 12.5 GB/s
    from trainplan.explain import explain_time_lines

    line = explain_time_lines(evaluate(make_plan(**kw, nic_gbps=100)))[-2]
    assert "90 GB/s of bus bandwidth (8 NICs of 11.2 GB/s achieved per node, 100 Gb/s each)" in line
    with pytest.raises(PlanError) as e:
        resolve(make_plan(**{**kw, "gpu": "RTX-4090"}))
    assert e.value.field == "nic_gbps" and "16 GPUs span 2 nodes of 8" in e.value.rule
    assert resolve(make_plan(**{**kw, "gpu": "RTX-4090"}, nic_gbps=100)).gpu.nic_gbps == 100
    with pytest.raises(PlanError) as e:
        resolve(make_plan(model="llama-3-8b", gpu="TPU-v4", gpus=8, zero=3))
    assert e.value.field == "scale_up_gbs"
    single = evaluate(make_plan(model="llama-3-8b", gpu="TPU-v4", gpus=1, finetune="lora", seq_len=1024))
    assert np.isfinite(single.time["step_s"])  # one chip crosses no link
    # a TPU v5p slice shares one ICI domain: as many "per node" as chips, no network needed
    assert np.isfinite(evaluate(make_plan(model="llama-3-8b", gpu="TPU-v5p", gpus=64, gpus_per_node=64,
                                          zero=3)).time["step_s"])
    # Gaudi 2 and 3 take their 3 scale-out ports per chip (docs.habana.ai network configuration)
    assert (catalog.gpu("Gaudi2").nic_gbps, catalog.gpu("Gaudi3").nic_gbps) == (300, 600)
    assert np.isfinite(evaluate(make_plan(**{**kw, "gpu": "Gaudi2"})).time["step_s"])


def test_gpus_per_node_default_to_the_accelerators_scale_up_domain():
    """A plan's node is the GPUs one scale-up link joins, by default the accelerator's own: 8 for
    an HGX server, 72 for a GB200 NVL72 rack (one NVLink domain), a TPU v5p slice's 6,144 chips
    on ICI (Google's v5p page: the largest single-slice job). On 72 GB200s TP 8 x DP 9 crosses
    no network; on 64 H100s the same cut reduces over the NICs. --gpus-per-node still rules."""
    from trainplan.estimate.collectives import link
    from trainplan.estimate.hardware import hardware
    from trainplan.estimate.time import step_derivation

    assert (make_plan(gpu="H100-SXM").gpus_per_node, make_plan(gpu="GB200").gpus_per_node,
            make_plan(gpu="TPU-v5p").gpus_per_node) == (8, 72, 6144)
    assert make_plan(gpu="GB200", gpus_per_node=4).gpus_per_node == 4
    rack = resolve(make_plan(model="llama-3-70b", gpu="GB200", gpus=72, tp=8, zero=1, gbs=72))
    assert rack.plan.gpus_per_node == 72
    hw = hardware(rack)
    assert link(hw, comm.ALL_GATHER, 9, 8, 72)[0] == pytest.approx(hw.nvlink)  # DP 9 inside the rack
    split = resolve(make_plan(model="llama-3-70b", gpu="GB200", gpus=72, tp=8, zero=1, gbs=72, gpus_per_node=8))
    # 8-GPU nodes: DP 9 (one rank per node) over one NIC each, 45 GB/s against NVLink's 720
    assert link(hardware(split), comm.ALL_GATHER, 9, 8, 8)[0] == pytest.approx(hw.nic) == pytest.approx(45e9)
    assert hw.nvlink == pytest.approx(720e9)
    wire = {name: float(np.asarray(step_derivation(lay)["dp_collectives_s"]["reduce_scatter"]).ravel()[0])
            - float(np.asarray(step_derivation(lay)["dp_call_latency_s"]["reduce_scatter"]).ravel()[0])
            for name, lay in (("inside", rack), ("across", split))}
    assert wire["across"] / wire["inside"] == pytest.approx(720 / 45, rel=1e-9)
    # the TPU slice's chips on ICI: no network needed up to 6,144 of them
    assert np.isfinite(evaluate(make_plan(model="llama-3-8b", gpu="TPU-v5p", gpus=256, zero=3)).time["step_s"])


def test_hybrid_sharding_reduces_inside_the_node_and_all_reduces_the_shards_across_replicas():
    """HSDP (--dp-shard 8: FSDP sharded over the 8 GPUs of a node, replicated over 64 nodes):
    the gathers and reduce-scatters run over NVLink, and each reduce-scatter's output, 1/8 of
    the gradients, is then all-reduced by the 64 replicas, one GPU per node, over one NIC each:
    each call at the algorithm and protocol NCCL's tuner picks for its size (comm.nccl_call: one
    rank per node, the ring pays the tree's network latency, or the tree runs). The optimizer
    state shards over 8 ranks, not 512. Without hybrid sharding nothing changes."""
    from trainplan.estimate.collectives import link
    from trainplan.estimate.hardware import hardware
    from trainplan.estimate.time import step_derivation

    kw = dict(model="llama-3-8b", gpu="H100-SXM", gpus=512, zero=3, framework="fsdp", gbs=512)
    full, hybrid = resolve(make_plan(**kw)), resolve(make_plan(**kw, dp_shard=8))
    assert (full.dp_shard, hybrid.dp_shard) == (512, 8)
    d = step_derivation(hybrid)
    hw = hardware(hybrid)
    t = 8_030_261_248.0
    nic_bw, lat = link(hw, comm.ALL_REDUCE, 64, 8, 8)
    assert nic_bw == pytest.approx(hw.nic)  # one GPU of each node in a replica group
    calls = 33  # 32 layers and the root, one call each
    want = calls * float(comm.nccl_call(comm.ALL_REDUCE, t * 4 / 8 / calls, 64, 64, 1, hw.nic, hw.nccl)[0])
    assert want > 2 * 63 / 64 * t * 4 / 8 / hw.nic  # the bytes at the NIC's bus bandwidth, and latency
    assert float(np.asarray(d["dp_collectives_s"]["replica_all_reduce"]).ravel()[0]) == pytest.approx(want, rel=1e-9)
    nvl_bw = link(hw, comm.REDUCE_SCATTER, 8, 1, 8)[0]
    assert nvl_bw == pytest.approx(hw.nvlink)
    rs = calls * float(comm.nccl_call(comm.REDUCE_SCATTER, t * 4 / calls, 8, 1, 8, nvl_bw, hw.nccl)[0])
    assert float(np.asarray(d["dp_collectives_s"]["reduce_scatter"]).ravel()[0]) == pytest.approx(rs + want, rel=1e-9)
    mem_full, mem_hybrid = evaluate(make_plan(**kw)).memory, evaluate(make_plan(**kw, dp_shard=8)).memory
    assert float(mem_hybrid["optimizer"][0]) == pytest.approx(float(mem_full["optimizer"][0]) * 64)
    assert evaluate(make_plan(**kw, dp_shard=512)).time["step_s"] == evaluate(make_plan(**kw)).time["step_s"]
    with pytest.raises(PlanError) as e:
        resolve(make_plan(**kw, dp_shard=3))
    assert e.value.field == "dp_shard" and "must divide dp (512)" in e.value.rule
    with pytest.raises(PlanError) as e:  # DeepSpeed: MiCS is ZeRO-3's
        resolve(make_plan(**{**kw, "zero": 2, "framework": "deepspeed"}, dp_shard=8))
    assert e.value.field == "dp_shard" and "MiCS" in e.value.rule
    from typer.testing import CliRunner

    from trainplan.cli import app

    out = CliRunner().invoke(app, ["plan", "--model", "llama-3-8b", "--gpus", "512", "--zero", "3", "--dp-shard", "8"])
    assert out.exit_code == 0 and "ZeRO-3 sharded over 8 of DP (HSDP)" in out.output


def test_lora_backward_computes_no_weight_gradients_of_the_frozen_base():
    """LoRA (Hu et al. 2021) freezes the base weights: their backward computes the input
    gradients only, and the rank-r adapters add their own GEMMs (x·A, then ·B; both gradients
    of each in the backward); the frozen output head's backward is one GEMM. On NeMo AutoModel's
    published LoRA run (performance summary, DGX-H100 BF16: Llama 3.1 8B, rank 16 on every
    linear, 1 GPU, 32 x 4,096 tokens a step in 10.51 s, 12,472.87 tokens/s) the model is within
    6% (+5.3%); priced with the base's weight gradients, as full training, it was 17% too slow."""
    from trainplan.estimate.gemm_rates import (
        attention_input_gemms,
        layer_gemm_time,
        layer_gemms,
        lora_gemms,
    )
    from trainplan.estimate.hardware import hardware
    from trainplan.estimate.time import step_derivation

    kw = dict(model="llama-3.1-8b", gpu="H100-SXM", gpus=1, gbs=32, mbs=2, seq_len=4096, finetune="lora",
              framework="fsdp", attention="sdpa", lora_rank=16)
    lay = resolve(make_plan(**kw))
    hw, model = hardware(lay), lay.model
    args = (8192, 1, 1, model.n_kv_heads, model.top_k, hw.gemm_peak, hw.gemm_eff, hw.sms, 2, hw.gemm_curve)
    base, adapters = layer_gemms(model, False), lora_gemms(model, False, tuple(lay.plan.lora_targets), 16)
    assert adapters.fan_in.size == 2 * 7  # A and B on q, k, v, o, gate, up, down
    layer = step_derivation(lay)["detail"]["layer"]["dense"]
    assert float(layer["gemm_backward"]) == pytest.approx(
        layer_gemm_time(base, *args, backward=True, weight_grad=False) + layer_gemm_time(adapters, *args, backward=True))
    assert float(layer["gemm_forward"]) == pytest.approx(layer_gemm_time(base, *args) + layer_gemm_time(adapters, *args))
    # the first layer's q, k, v projections compute no input gradient (the frozen embedding needs none)
    d = step_derivation(lay)
    first = layer_gemm_time(attention_input_gemms(model), *args, backward=True, weight_grad=False)
    assert first > 0 and float(np.asarray(d["micro_batch_s"]["compute"]).ravel()[0]) == pytest.approx(
        model.layers * float(layer["total"]) + float(d["detail"]["head"]) + float(d["detail"]["embedding"]) - first)
    tokens = evaluate(make_plan(**kw)).time["tokens_per_s"]
    assert tokens / 12472.87 - 1 == pytest.approx(0.053, abs=0.01)
    # its FLOPs count the input gradients only: 4N + attention per token, not 6N
    fl = step_flops(model, tokens=1, seq=1, dense_layers=model.layers, moe_layers=0, head=1, attention_eager=True,
                    recompute=0, lora_targets=())
    # (less the first layer's q, k, v input gradients: the frozen embedding needs none)
    first = 2 * model.hidden * (model.q_dim + 2 * model.kv_dim)
    assert fl["backward"] == pytest.approx(fl["gemm_forward"] + fl["head_forward"] + 2 * fl["attention_forward"] - first)


def test_fsdp_pays_the_latency_of_every_layers_collectives():
    """FSDP gathers and reduce-scatters one wrapped unit (a layer, and the root) at a time, so a
    step of MPT-1B (24 layers) under SHARD_GRAD_OP issues 25 all-gathers and 25 reduce-scatters,
    each paying the ring latency of the whole data-parallel group (LL128 at these sizes, as
    NCCL's tuner picks on servers whose GPUs share a PCIe switch with their NICs): 1.12 ms over
    512 GPUs against 0.29 ms over 128. The predicted throughput per GPU falls with the GPU count,
    as llm-foundry's large-scale H100 table does (44,123 -> 39,837 tokens/s per GPU, -9.7%, from
    128 to 512 GPUs); the model sees about a sixth of that drop (-1.6%)."""
    tokens = {}
    for g in (128, 512):
        spec = ModelSpec(name="MPT-1b", source="test", layers=24, hidden=2048, heads=16, ffn=8192, mlp="gelu",
                         vocab=50368, tied_embeddings=True, norm="layernorm", position="learned", max_position=2048,
                         fused_qkv=True)
        t = evaluate(make_plan(gpu="H100-SXM", gpus=g, zero=2, framework="fsdp", mbs=12, gbs=12 * g, seq_len=2048,
                               attention="triton", fused_loss=True, reduce_dtype="bf16", backward_prefetch="post"),
                     spec=spec).time
        tokens[g] = t["tokens_per_s"] / g
        lay = resolve(make_plan(model="llama-3-8b", gpu="H100-SXM", gpus=g, zero=2, framework="fsdp"))
        assert recipe(lay.plan).per_unit_collectives
    drop = tokens[512] / tokens[128] - 1
    assert -0.097 < drop < -0.01 and drop == pytest.approx(-0.016, abs=0.005)
    # `plan --explain` shows the calls and their latency
    from trainplan.explain import explain_time_lines

    lines = explain_time_lines(evaluate(make_plan(model="llama-3-8b", gpu="H100-SXM", gpus=512, zero=3,
                                                  framework="fsdp", gbs=1024)))
    assert "each collective 33 calls (a layer each, and the root) of 1.12 ms NCCL latency" in lines[-2]
    # and the algorithm NCCL's tuner runs them with
    assert "NCCL runs (its tuner's algorithm/protocol for the call size) all-gather ring/LL128, " \
        "reduce-scatter ring/LL128" in lines[-2]


def test_recomputing_some_layers_pays_their_share_of_the_recomputation():
    """--recompute-layers n under full recomputation re-runs the first n layers of each stage
    (Megatron's --recompute-method block; of each virtual stage when interleaved): Llama 3 70B on TP 8 x PP 2 has 40 layers a stage,
    so 10 of them pay a quarter of full recomputation's extra compute, TP collectives and
    hardware FLOPs, and 0 of them nothing (the step and the FLOPs of no recomputation)."""
    kw = dict(model="llama-3-70b", gpus=64, tp=8, pp=2, gbs=32)
    none, full, some, zero = (evaluate(make_plan(**kw, **extra)).time for extra in (
        dict(recompute="none"), dict(recompute="full"), dict(recompute="full", recompute_layers=10),
        dict(recompute="full", recompute_layers=0)))
    for part in ("compute", "tp_comm"):
        a, b = none["breakdown_s"][part], full["breakdown_s"][part]
        assert b > a
        assert some["breakdown_s"][part] == pytest.approx(a + (b - a) / 4, rel=1e-9)
        assert zero["breakdown_s"][part] == pytest.approx(a, rel=1e-9)
    extra = full["hardware_flops_per_step"] - full["model_flops_per_step"]
    assert some["hardware_flops_per_step"] == pytest.approx(some["model_flops_per_step"] + extra / 4, rel=1e-9)
    assert zero["hardware_flops_per_step"] == pytest.approx(none["hardware_flops_per_step"], rel=1e-9)
    assert none["step_s"] < some["step_s"] < full["step_s"]
    # interleaved over 4 virtual stages of 10 layers, Megatron counts the layers per virtual stage:
    # 3 of each is 12 of a stage's 40, and more than 10 is refused by name
    kw = {**kw, "schedule": "interleaved", "vpp": 4}
    none, full, some = (evaluate(make_plan(**kw, **extra)).time for extra in (
        dict(recompute="none"), dict(recompute="full"), dict(recompute="full", recompute_layers=3)))
    a, b = none["breakdown_s"]["compute"], full["breakdown_s"]["compute"]
    assert some["breakdown_s"]["compute"] == pytest.approx(a + (b - a) * 12 / 40, rel=1e-9)
    with pytest.raises(PlanError) as e:
        resolve(make_plan(**kw, recompute="full", recompute_layers=11))
    assert e.value.field == "recompute_layers" and "virtual stage (10" in e.value.rule


def test_an_offloaded_optimizer_steps_on_the_host_and_costs_time():
    """ZeRO-Offload (DeepSpeed, stage 2) moves each rank's gradient partition to the host in fp32,
    steps DeepSpeedCPUAdam there over the fp32 master copy and moments (28 bytes a parameter,
    memory-bound, for all 8 ranks a host serves) and sends the bf16 parameters back. Llama 3 8B
    on 8 GPUs, one micro-batch a step: the host's step is P x 28 B / 200 GB/s, the copy back
    P/8 x 2 B / 25 GB/s; the gradients' copy hides partly behind the backward. It was priced at
    no time at all, which made offloading look faster than not."""
    from trainplan.estimate.time import step_derivation

    kw = dict(model="llama-3-8b", gpus=8, gbs=8, zero=2)
    lay = resolve(make_plan(**kw, offload_optimizer=True))
    P = 8_030_261_248
    off = {k: float(np.asarray(v).ravel()[0]) for k, v in step_derivation(lay)["offloaded_optimizer_s"].items()}
    assert off["host_step"] == pytest.approx(P * 28 / 200e9, rel=1e-6)
    assert off["to_device"] == pytest.approx(P / 8 * 2 / 25e9, rel=1e-6)
    assert 0 < off["to_host"] < P / 8 * 4 / 25e9  # partly hidden behind the backward
    # not overlapped, the whole fp32 partition crosses PCIe (one reduction: one micro-batch)
    exposed = step_derivation(resolve(make_plan(**kw, offload_optimizer=True, overlap_dp=False)))
    assert float(np.ravel(exposed["offloaded_optimizer_s"]["to_host"])[0]) == pytest.approx(P / 8 * 4 / 25e9)
    offloaded, on_gpu = evaluate(make_plan(**kw, offload_optimizer=True)).time, evaluate(make_plan(**kw)).time
    assert offloaded["breakdown_s"]["optimizer"] == pytest.approx(sum(off.values()), rel=1e-9)
    assert offloaded["step_s"] > on_gpu["step_s"] + 1.0
    # twice the host's memory bandwidth halves its step; torch.optim on the host (FSDP's CPU
    # offload) moves a for-loop step's 80 bytes a parameter instead of 28
    fast = step_derivation(resolve(make_plan(**kw, offload_optimizer=True, host_gbs=400)))
    assert float(np.ravel(fast["offloaded_optimizer_s"]["host_step"])[0]) == pytest.approx(off["host_step"] / 2)
    fsdp = step_derivation(resolve(make_plan(**{**kw, "zero": 3}, framework="fsdp", offload_optimizer=True)))
    assert float(np.ravel(fsdp["offloaded_optimizer_s"]["host_step"])[0]) == pytest.approx(
        off["host_step"] * 2.857, rel=1e-6)
    # DeepSpeed offloads only a partitioned optimizer: ZeRO-0 is refused by name
    with pytest.raises(PlanError) as e:
        resolve(make_plan(model="llama-3-8b", gpus=8, zero=0, offload_optimizer=True))
    assert e.value.field == "offload_optimizer" and "--zero 1" in e.value.rule


def test_offloaded_parameters_are_fetched_from_the_host_for_every_gather():
    """ZeRO-Infinity's parameter offload: ZeRO-3 gathers each rank's bf16 shard from the host
    first, twice a micro-batch (forward and backward), prefetched beside the compute; the
    updated parameters stay on the host."""
    from trainplan.estimate.time import step_derivation

    kw = dict(model="llama-3-8b", gpus=8, gbs=8, zero=3, offload_optimizer=True)
    with_params = step_derivation(resolve(make_plan(**kw, offload_params=True)))
    without = step_derivation(resolve(make_plan(**kw)))
    fetch = float(np.ravel(with_params["param_fetch_s"])[0])
    shard_fetch = 8_030_261_248 / 8 * 2 / 25e9  # a rank's bf16 shard over 25 GB/s of PCIe
    assert 0 < fetch < 2 * shard_fetch  # prefetched beside the compute
    exposed = step_derivation(resolve(make_plan(**kw, offload_params=True, overlap_dp=False)))
    assert float(np.ravel(exposed["param_fetch_s"])[0]) == pytest.approx(2 * shard_fetch)  # forward and backward
    assert float(np.ravel(without["param_fetch_s"])[0]) == 0
    assert float(np.ravel(with_params["offloaded_optimizer_s"]["to_device"])[0]) == 0


def test_qlora_dequantizes_each_weight_at_every_use():
    """bitsandbytes' MatMul4Bit dequantizes the NF4 weight to bf16 before each matmul: in the
    forward, in a recomputed forward and for the backward's input gradient. Each use reads
    4.127 bits and writes 2 bytes per parameter: Llama 3 8B's 218,103,808 layer weights cost
    that pass 3 times a layer under full recompute, which is all QLoRA's step adds to LoRA's
    on one RTX 4090."""
    from trainplan.estimate.hardware import hardware
    from trainplan.estimate.time import step_derivation

    kw = dict(model="llama-3-8b", gpus=1, gpu="RTX-4090", lora_rank=16, seq_len=2048, recompute="full")
    lay = resolve(make_plan(**kw, finetune="qlora"))
    per_use = 218_103_808 * (4.127 / 8 + 2) / hardware(lay).hbm
    assert float(step_derivation(lay)["detail"]["layer"]["dense"]["dequantize"]) == pytest.approx(per_use)
    qlora, lora = evaluate(make_plan(**kw, finetune="qlora")).time, evaluate(make_plan(**kw, finetune="lora")).time
    assert qlora["step_s"] - lora["step_s"] == pytest.approx(32 * 3 * per_use, rel=1e-9)


def test_lora_dropout_costs_a_pass_over_each_adapters_input():
    """PEFT's lora_dropout drops each adapter's input: a pass reading it and writing the dropped
    copy and a 1-byte mask in the forward, and one in the backward. Llama 3.1 8B, all seven
    linears adapted: 3 x 4,096 (q, k, v) + 4,096 (o) + 2 x 4,096 (gate, up) + 14,336 (down) =
    38,912 elements a token, for 8,192 tokens a micro-batch, 32 layers, 16 micro-batches. (On
    NeMo AutoModel's published LoRA run, whose config sets dropout 0.1, the step then comes to
    12,448 tokens/s against the published 12,473; its memory, with Triton LoRA kernels, is not
    PEFT's.) Only LoRA and QLoRA take it."""
    from trainplan.estimate.hardware import hardware

    kw = dict(model="llama-3.1-8b", gpu="H100-SXM", gpus=1, gbs=32, mbs=2, seq_len=4096, finetune="lora",
              framework="fsdp", attention="sdpa", lora_rank=16)
    plain, dropped = evaluate(make_plan(**kw)).time, evaluate(make_plan(**kw, lora_dropout=0.1)).time
    hbm = hardware(resolve(make_plan(**kw))).hbm
    passes = 16 * 32 * 2 * 8192 * 38_912 * (2 * 2 + 1) / hbm
    assert dropped["step_s"] - plain["step_s"] == pytest.approx(passes, rel=1e-9)
    assert dropped["tokens_per_s"] / 12472.87 - 1 == pytest.approx(-0.002, abs=0.01)
    with pytest.raises(PlanError) as e:
        resolve(make_plan(model="llama-3-8b", lora_dropout=0.1))
    assert e.value.field == "lora_dropout" and "lora or qlora" in e.value.rule


def test_moe_element_wise_work_covers_every_routed_copy():
    """An MoE layer's activation runs on each of a token's top-k routed copies and on the shared
    experts: Mixtral 8x7B's SwiGLU reads gate and up and writes their product over 2 x 14,336
    per token, not one MLP's 14,336; norms and residual adds over 10 x 4,096, RoPE over
    2 x (4,096 + 1,024)."""
    from trainplan.estimate.hardware import hardware
    from trainplan.estimate.time import step_derivation

    lay = resolve(make_plan(model="mixtral-8x7b", gpus=8, ep=8, gbs=8, seq_len=4096))
    per_token = 10 * 4096 + 3 * 2 * 14336 + 2 * (4096 + 1024)
    want = 4096 * per_token * 2 / hardware(lay).hbm
    got = float(np.ravel(step_derivation(lay)["detail"]["layer"]["moe"]["elementwise_forward"])[0])
    assert got == pytest.approx(want, rel=1e-9)
