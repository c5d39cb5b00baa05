"""Expert parallelism across ranks and ZeRO-2 as DeepSpeed and Megatron run it, measured per
rank over gloo (validate/expert_parallel.py, validate/zero2.py) against the planner.

Targets: states exact but for AdamW's scalar step counters (4 bytes per parameter tensor);
saved bytes within 0.1%; FLOPs exact (FlopCounterMode)."""

import pytest

torch = pytest.importorskip("torch")

from trainplan.errors import PlanError  # noqa: E402
from trainplan.plan import make_plan, resolve  # noqa: E402
from trainplan.validate.expert_parallel import validate_expert_parallel  # noqa: E402
from trainplan.validate.matrix import EXPERT_PARALLEL, ZERO2  # noqa: E402
from trainplan.validate.run import Scale, validate  # noqa: E402

STATE_TOL, ACT_TOL = 0.005, 1e-3
SMALL = Scale(layers=2, hidden=64, vocab=512, seq_len=64, mbs=1)


def _check(case):
    err = case["rel_error"]
    for term in ("params_bytes", "grads_bytes", "optimizer_bytes"):
        assert abs(err[term]) <= STATE_TOL, (case["name"], term, err[term])
    assert err["params_bytes"] == 0.0 and err["grads_bytes"] == 0.0, case["name"]
    assert abs(err["activations_bytes"]) <= ACT_TOL, (case["name"], err["activations_bytes"])
    assert err["flops"] == 0.0, case["name"]


def test_expert_parallel_balanced_matches_every_rank():
    """Mixtral scaled to 4 experts, hidden 64, 64 tokens, EP 2: each rank holds 2 experts and,
    under balanced routing, receives 64 of the 128 routed copies of each layer; every term of
    every rank matches the planner's per-rank prediction."""
    _, kw = EXPERT_PARALLEL[0]
    data = validate(make_plan(**kw), device="cpu")
    cases = data["cases"]
    assert len(cases) == 2
    for case in cases:
        _check(case)
    # the routed experts are split: each rank holds half of them, the rest replicated
    assert cases[0]["measured"]["params_bytes"] == cases[1]["measured"]["params_bytes"]


def test_expert_parallel_megatron_experts_match_every_rank():
    """Megatron-Core's convention across ranks: bf16 weights, fp32 main gradients and master
    copies, each routed copy's gate weight dispatched with it into the weighted SwiGLU and a
    fused un-permuting sum (only the index kept): every term of both ranks matches."""
    _, kw = EXPERT_PARALLEL[2]
    assert kw["framework"] == "megatron"
    for case in validate(make_plan(**kw), device="cpu")["cases"]:
        _check(case)


def test_expert_parallel_skewed_routing_spreads_the_ranks():
    """70/30 routing: 7 of every 10 routed copies go to rank 0's experts. With 64 tokens x top-2
    = 128 copies per rank per layer, 91 of each rank's copies go to rank 0 (copies 0..127 with
    c mod 10 < 7), so rank 0 runs 182 copies and rank 1 74 per layer. The states stay exact;
    the work and the saved bytes move, their sum over the ranks conserved (the balanced
    prediction x 2), and the FLOPs gap is exactly 108 copies x 2 layers x 6 x 3 matrices x
    hidden 64 x expert ffn."""
    _, kw = EXPERT_PARALLEL[0]
    data = validate_expert_parallel(make_plan(**kw), routing="skewed")
    r0, r1 = data["cases"]
    for case in (r0, r1):
        for term in ("params_bytes", "grads_bytes"):
            assert case["rel_error"][term] == 0.0
    pred = r0["predicted"]
    assert r0["measured"]["flops"] + r1["measured"]["flops"] == 2 * pred["flops"]
    assert r0["measured"]["activations_bytes"] + r1["measured"]["activations_bytes"] == pytest.approx(
        2 * pred["activations_bytes"], rel=ACT_TOL)
    assert r0["measured"]["activations_bytes"] > pred["activations_bytes"] > r1["measured"]["activations_bytes"]
    ffn = 224  # Mixtral's expert ffn 14,336 scaled by 64/4,096 to a multiple of 8
    assert r0["measured"]["flops"] - r1["measured"]["flops"] == (182 - 74) * 2 * 6 * 3 * 64 * ffn


def test_zero2_deepspeed_partitions_the_gradients():
    """DeepSpeed stage 2, dp 2, bf16 + AdamW: 16-bit parameters replicated, the reduce-scattered
    16-bit gradient partition, fp32 master + Adam state on the partition: every term exact at the
    end of the step. The gradients' peak is the step's: the 16-bit partition plus its fp32 cast
    (2 + 4 bytes per partition parameter = 3x the kept partition), above the full 16-bit
    gradients at the end of the backward (2x)."""
    _, kw = ZERO2[0]
    data = validate(make_plan(**kw), SMALL, device="cpu")
    for case in data["cases"]:
        _check(case)
        kept = case["measured"]["grads_bytes"]
        assert case["grads_full_bytes"] == 2 * kept
        assert case["grads_step_bytes"] == 3 * kept == case["grads_peak_bytes"]


def test_zero2_megatron_keeps_the_whole_gradient_buffer():
    """Megatron's distributed optimizer reduce-scatters into its own contiguous fp32 buffer and
    keeps it whole: 4 bytes per parameter on every rank, as at ZeRO-1 (the planner's rule for
    --zero 2 --framework megatron)."""
    _, kw = ZERO2[1]
    data = validate(make_plan(**kw), SMALL, device="cpu")
    for case in data["cases"]:
        _check(case)
        assert case["measured"]["grads_bytes"] == 2 * case["measured"]["params_bytes"]  # fp32 vs bf16
        assert case["grads_peak_bytes"] == case["measured"]["grads_bytes"]


def test_planner_zero2_gradients_per_framework():
    """Llama 3 8B (8,030,261,248 parameters), dp 2, bf16: DeepSpeed's ZeRO-2 keeps a 2-byte gradient
    partition (Ψ bytes per rank); Megatron keeps its 4-byte buffer whole (4Ψ), as at ZeRO-1."""
    from trainplan.estimate.memory import estimate_memory

    n = 8_030_261_248
    grads = {}
    for fw in ("deepspeed", "megatron"):
        for zero in (1, 2):
            layout = resolve(make_plan(model="llama-3-8b", gpus=2, zero=zero, framework=fw, precision="bf16"))
            grads[fw, zero] = float(estimate_memory(layout)["grads"][0])
    assert grads["deepspeed", 2] == n
    assert grads["megatron", 2] == grads["megatron", 1] == 4 * n


def test_refusals_name_the_field():
    with pytest.raises(PlanError) as e:
        validate(make_plan(model="mixtral-8x7b", gpus=2, ep=2, framework="deepspeed"), device="cpu")
    assert e.value.field == "framework" and "--framework megatron" in e.value.rule
    with pytest.raises(PlanError) as e:
        validate_expert_parallel(make_plan(model="mixtral-8x7b", gpus=2, ep=2, framework="torch"), routing="zipf")
    assert e.value.field == "routing" and "balanced" in e.value.rule
    with pytest.raises(PlanError) as e:
        validate(make_plan(model="llama-3-8b", gpus=2, zero=2, framework="deepspeed", optimizer="sgd"), device="cpu")
    assert e.value.field == "optimizer" and "AdamW" in e.value.rule
