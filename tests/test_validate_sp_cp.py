"""Sequence parallelism measured per rank (DTensor, validate/sequence.py) against the planner's
`torch`/`fsdp` convention, and context parallelism, which validate refuses on the CPU, with the
reason checked against torch itself.

States: parameters and gradients exact, the optimizer off by AdamW's 4-byte step counter per
parameter tensor; bytes saved for backward within 3%; this rank's FLOPs exact."""

from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")

from trainplan.errors import PlanError  # noqa: E402
from trainplan.estimate.memory import layout_inputs, numbers_for, stage_memory  # noqa: E402
from trainplan.estimate.recipe import recipe  # noqa: E402
from trainplan.plan import make_plan, resolve  # noqa: E402
from trainplan.validate.matrix import SEQUENCE_PARALLEL, SP_SCALE  # noqa: E402
from trainplan.validate.run import Scale, validate  # noqa: E402

ACT_TOL = 0.03
ADAMW_STEP_BYTES = 4
TENSORS = 2 * 9 + 3  # 2 Llama layers (q, k, v, o, gate, up, down, two norms), embedding, final norm, head
B, S, H = SP_SCALE["mbs"], SP_SCALE["seq_len"], SP_SCALE["hidden"]


def _run(label):
    kw = dict(SEQUENCE_PARALLEL)[label]
    return validate(make_plan(**kw), Scale(**SP_SCALE), device="cpu")["cases"]


@pytest.fixture(scope="module")
def fp32_cases():
    return _run("TP 2 + SP")


def _check_rank(c):
    p, m = c["predicted"], c["measured"]
    assert m["params_bytes"] == p["params_bytes"]
    assert m["grads_bytes"] == p["grads_bytes"]
    assert m["optimizer_bytes"] - p["optimizer_bytes"] == ADAMW_STEP_BYTES * TENSORS
    assert abs(c["rel_error"]["activations_bytes"]) < ACT_TOL
    assert m["flops"] == p["flops"]  # this rank's shards, exactly


def test_sp_every_rank_matches_the_torch_rule(fp32_cases):
    assert len(fp32_cases) == 2
    for c in fp32_cases:
        _check_rank(c)
        # Megatron's rule (sequence-sharded linear inputs) misses what DTensor keeps: the attention
        # and MLP inputs of both layers and the head's input, each b·s·h fp32, half of it on this rank
        missing = (2 * 2 + 1) * B * S * H * 4 / 2
        assert c["predicted"]["activations_bytes"] - c["activations_sequence_sharded"] == missing
        assert c["measured"]["activations_bytes"] / c["activations_sequence_sharded"] - 1 > 0.05


def test_sp_saves_norms_sharded_and_linear_inputs_gathered(fp32_cases):
    saved = fp32_cases[0]["saved_layer0"]  # (bytes, shape, dtype, local shape, placements)
    norm_inputs = [s for s in saved if s[4] == "(Shard(dim=1),)" and s[1] == [B, S, H]]
    assert norm_inputs and all(s[3] == [B, S // 2, H] and s[0] == B * S // 2 * H * 4 for s in norm_inputs)
    gathered = [s for s in saved if s[1] == [B * S, H]]
    # the one gathered input the attention's q, k, v share and the MLP's gate and up share
    assert len(gathered) == 2 and all(s[3] == [B * S, H] and s[4] == "(Replicate(),)" for s in gathered)


def test_sp_with_fsdp_4_ranks():
    cases = _run("TP 2 + SP x FSDP2 dp 2")
    assert len(cases) == 4
    for c in cases:
        p, m = c["predicted"], c["measured"]
        assert m["params_bytes"] == p["params_bytes"] and m["grads_bytes"] == p["grads_bytes"]
        assert abs(c["rel_error"]["activations_bytes"]) < ACT_TOL
        assert m["flops"] == p["flops"]


def _activations(plan, **over):
    layout = resolve(plan)
    r = replace(recipe(plan), **over)
    return float(stage_memory(numbers_for(layout), r, **layout_inputs(layout))["activations"][0])


def test_planner_sp_conventions_differ_by_the_gathered_inputs():
    """Llama 3 8B, tp 8 with SP, bf16 under autocast: DTensor keeps the gathered inputs, each of q, k, v
    its own bf16 cast, gate and up theirs (5 per layer), and the head's (1); Megatron keeps 1/t of them."""
    plan = make_plan(model="llama-3-8b", gpus=8, tp=8, sp=True, precision="bf16", framework="torch", mbs=1,
                     seq_len=4096)
    assert recipe(plan).sp_gathers_saved_inputs
    assert not recipe(plan.model_copy(update={"framework": "megatron"})).sp_gathers_saved_inputs
    assert not recipe(plan.model_copy(update={"framework": "deepspeed"})).sp_gathers_saved_inputs
    delta = _activations(plan) - _activations(plan, sp_gathers_saved_inputs=False)
    tokens, h, layers = 4096, 4096, 32
    assert delta == tokens * h * 2 * (5 * layers + 1) * (1 - 1 / 8)


def test_sp_refusals_name_the_field():
    with pytest.raises(PlanError) as e:  # before any process starts
        validate(make_plan(model="mixtral-8x7b", gpus=2, tp=2, sp=True, precision="fp32", framework="torch"),
                 Scale(**SP_SCALE), device="cpu")
    assert e.value.field == "sp" and "MoE" in e.value.rule


def test_cp_ring_attention_cannot_run_on_the_cpu_as_torch_ships_it():
    """What torch's context_parallel does on two gloo ranks under every SDPA backend, without the
    CPU flash kernel's entry in its op table that validate/context_parallel.py adds."""
    from trainplan.validate.sequence import probe_context_parallel_cpu

    out = probe_context_parallel_cpu()
    assert out["FLASH_ATTENTION"].startswith("NotImplementedError") and \
        "_scaled_dot_product_flash_attention_for_cpu" in out["FLASH_ATTENTION"]
    assert out["MATH"].startswith("RuntimeError") and "DTensor" in out["MATH"]
    assert all(out[b].startswith("RuntimeError: No viable backend") for b in ("EFFICIENT_ATTENTION", "CUDNN_ATTENTION"))
