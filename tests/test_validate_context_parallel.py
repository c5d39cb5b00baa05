"""Context parallelism run for real: torch's context_parallel ring attention on two gloo ranks on
the CPU (validate/context_parallel.py adds the CPU flash kernel to torch's CP op table), against
the planner's per-GPU prediction, rank by rank: bytes saved for backward within 3% (the copied
attention output on every rank but the last, conventions.toml `cp_ring_output_copy`),
parameters and gradients exact, the optimizer off by AdamW's 4-byte step counter per parameter
tensor, the loss that of one process, FLOPs short of the planner's by exactly the blocks the
ring skips under the causal mask."""

import pytest

torch = pytest.importorskip("torch")

from trainplan.errors import PlanError  # noqa: E402
from trainplan.plan import make_plan  # noqa: E402
from trainplan.validate.matrix import CONTEXT_PARALLEL, CP_SCALE  # noqa: E402
from trainplan.validate.run import HEAD_DIM, Scale, validate  # noqa: E402

ACT_TOL = 0.03
ADAMW_STEP_BYTES = 4
TENSORS = 2 * 9 + 3  # two Llama-style layers (q, k, v, o, gate, up, down, two norms), embedding, final norm, head


def _run(label):
    return validate(make_plan(**dict(CONTEXT_PARALLEL)[label]), Scale(**CP_SCALE), device="cpu")["cases"]


def test_cp2_ring_attention_per_rank():
    cases = _run("CP 2 (ring)")
    cp, layers, b, s, h = 2, 2, CP_SCALE["mbs"], CP_SCALE["seq_len"], CP_SCALE["hidden"]
    heads = h // HEAD_DIM
    for c in cases:
        err, pred, meas = c["rel_error"], c["predicted"], c["measured"]
        assert abs(err["activations_bytes"]) <= ACT_TOL, (c["name"], err)
        assert err["params_bytes"] == 0.0 and err["grads_bytes"] == 0.0, c["name"]
        assert meas["optimizer_bytes"] - pred["optimizer_bytes"] == ADAMW_STEP_BYTES * TENSORS, c["name"]
        # the ring attention computes what one process computes
        assert c["loss"]["context_parallel"] == pytest.approx(c["loss"]["unsharded"], rel=1e-5)
        # FlopCounterMode's SDPA: 4·b·heads·s_q·s_k·d forward, 10·b·heads·s_q·s_k·d backward; the
        # ring runs (cp + 1)/(2cp) of the (s/cp) x s scores the planner counts
        core = layers * 14 * b * heads * (s // cp) * s * HEAD_DIM
        assert pred["flops"] - meas["flops"] == core * (cp - 1) // (2 * cp), c["name"]
    # rank 0 merges a partial block into its output (load balancing): its output projection keeps
    # a copy of the attention output, one (b, s/cp, h) fp32 tensor per layer; rank 1 a view of it
    copy = b * (s // cp) * h * 4
    assert [c["output_copy"] for c in cases] == [layers * copy, 0]
    saved0, saved1 = ([entry[0] for entry in c["saved_layer0"]] for c in cases)
    assert len(saved0) == len(saved1) + 1 and sum(saved0) - sum(saved1) == copy


def test_cp_refusals_name_the_field():
    with pytest.raises(PlanError) as e:  # before any process starts
        _run("CP 2 (all-gather)")
    assert e.value.field == "cp_comm"
    with pytest.raises(PlanError) as e:
        validate(make_plan(model="llama-3-8b", gpus=2, cp=2, precision="fp32", framework="torch"),
                 Scale(hidden=128, seq_len=66, mbs=1), device="cpu")
    assert e.value.field == "cp" and "2 x cp = 4" in e.value.rule  # torch's load balancer: 2·cp chunks
    with pytest.raises(PlanError) as e:
        validate(make_plan(model="mixtral-8x7b", gpus=2, cp=2, precision="fp32", framework="torch"),
                 Scale(**CP_SCALE), device="cpu")
    assert e.value.field == "model"
