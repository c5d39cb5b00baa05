"""The optimizer step and the framework's own passes over gradients, as memory-bound time.

The step's HBM traffic is counted op by op from what torch.optim actually dispatches (a
TorchDispatchMode sums the bytes each aten op reads and writes over the parameter-sized
tensors), and the time model prices those bytes at the accelerator's HBM rate."""

import numpy as np
import pytest

from trainplan.estimate.recipe import recipe
from trainplan.estimate.time import step_derivation
from trainplan.plan import conventions, make_plan
from trainplan.report import evaluate

H100_HBM = 3.35e12 * 0.88  # catalog bandwidth x conventions.toml [efficiency] hbm


def _hbm_bytes_per_element(run, n: int = 1 << 12) -> float:
    """HBM bytes per parameter that `run(parameter)` moves (fp32 parameter of n elements with a
    gradient), counted from the dispatched aten ops: every parameter-sized tensor an op reads,
    once, plus every one it writes (its schema's mutable arguments, or its fresh outputs)."""
    torch = pytest.importorskip("torch")
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class Traffic(TorchDispatchMode):
        total = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            big = lambda t: isinstance(t, torch.Tensor) and t.numel() == n  # noqa: E731
            reads = {t.data_ptr(): t.nbytes for t in tree_flatten((args, kwargs))[0] if big(t)}
            writes = {}
            values = list(args) + [kwargs.get(a.name) for a in func._schema.arguments[len(args):]]
            for arg, value in zip(func._schema.arguments, values, strict=True):
                if arg.alias_info is not None and arg.alias_info.is_write:
                    writes.update({t.data_ptr(): t.nbytes for t in tree_flatten(value)[0] if big(t)})
            if not any(r.alias_info is not None for r in func._schema.returns):
                writes.update({t.data_ptr(): t.nbytes for t in tree_flatten(out)[0] if big(t)})
            Traffic.total += sum(reads.values()) + sum(writes.values())
            return out

    p = torch.nn.Parameter(torch.randn(n))
    p.grad = torch.randn(n)
    prepare = run(p)  # a first call (the optimizer's state exists from here on) ...
    with Traffic():
        prepare()  # ... and the one counted
    return Traffic.total / n


def _adamw_step_bytes(impl: str) -> float:
    """One torch.optim.AdamW step."""
    import torch

    def run(p):
        opt = torch.optim.AdamW([p], fused=impl == "fused", foreach=impl == "foreach")
        opt.step()
        return opt.step

    return _hbm_bytes_per_element(run)


def _clip_bytes(foreach: bool) -> float:
    """One torch.nn.utils.clip_grad_norm_ (the gradient's norm is far above the threshold)."""
    import torch

    def run(p):
        return lambda: torch.nn.utils.clip_grad_norm_([p], max_norm=1.0, foreach=foreach)

    return _hbm_bytes_per_element(run)


def test_gradient_clipping_traffic():
    """torch.nn.utils.clip_grad_norm_ (torchtitan's max_norm, and what DDP and FSDP users call)
    reads every gradient for the norm and multiplies it in place by the clamped coefficient,
    foreach or not: 3 passes, 12 bytes per fp32 gradient, conventions.toml grad_clip_passes."""
    assert _clip_bytes(foreach=True) == 12
    assert _clip_bytes(foreach=False) == 12
    assert conventions()["frameworks"]["fsdp"]["grad_clip_passes"] == 3
    assert conventions()["frameworks"]["torch"]["grad_clip_passes"] == 3


def test_adamw_step_traffic_by_implementation():
    """PyTorch's foreach and for-loop AdamW run the same 8 passes (params *= 1 - lr·wd, lerp_,
    *= beta2, addcmul_, sqrt, div_, add_, addcdiv_): 80 bytes per fp32 parameter, counted from
    the ops they dispatch. The fused kernel reads gradient, parameter and both moments once
    and writes parameter and moments once: 28 (its schema marks the gradients written too, 32
    counted, for the in-place unscaling a GradScaler asks of it). conventions.toml
    [optimizer_step] prices foreach and for-loop at 80/28 of the fused step."""
    assert _adamw_step_bytes("foreach") == 80
    assert _adamw_step_bytes("for-loop") == 80
    assert _adamw_step_bytes("fused") == 28 + 4
    step = conventions()["optimizer_step"]
    assert step["foreach"] == step["for-loop"] == pytest.approx(80 / 28, rel=1e-3)
    assert step["fused"] == 1.0


def test_optimizer_step_time_follows_the_implementation():
    """Llama 3 8B, ZeRO-3 over 8 H100s: the step updates 1/8 of the trainable parameters. FSDP2
    (fp32 parameters are the master copy) moves 28 bytes per parameter fused, 80 foreach;
    Megatron (fp32 master + bf16 working weights) 30 fused: gradient 4, master and moments read
    and written 24, bf16 weights written 2. The framework picks the default: fused for
    torchtitan's FSDP2 and Megatron, foreach (torch.optim's own) for FSDP1 and DDP."""
    kw = dict(model="llama-3-8b", gpu="H100-SXM", gpus=8, zero=3, gbs=8, seq_len=4096, grad_clip=0)
    fused = evaluate(make_plan(**kw, framework="fsdp"))
    trainable = float(np.max(fused.memory["trainable_params"]))
    assert fused.time["breakdown_s"]["optimizer"] == pytest.approx(trainable / 8 * 28 / H100_HBM, rel=1e-9)
    foreach = evaluate(make_plan(**kw, framework="fsdp", optimizer_impl="foreach"))
    assert foreach.time["breakdown_s"]["optimizer"] == pytest.approx(trainable / 8 * 28 * 2.857 / H100_HBM, rel=1e-9)
    megatron = evaluate(make_plan(**{**kw, "zero": 1}, framework="megatron"))
    assert megatron.time["breakdown_s"]["optimizer"] == pytest.approx(trainable / 8 * 30 / H100_HBM, rel=1e-9)
    assert [recipe(make_plan(framework=f)).optimizer_impl for f in ("deepspeed", "megatron", "fsdp", "fsdp1", "torch")] \
        == ["fused", "fused", "fused", "foreach", "foreach"]


def _bookkeeping_s(**kw) -> tuple[float, float, int]:
    result = evaluate(make_plan(**kw))
    d = step_derivation(result.layout)
    return (float(np.asarray(d["dp_bookkeeping_s"]).ravel()[0]), float(np.max(result.memory["trainable_params"])),
            result.layout.micro_batches)


def test_framework_passes_over_gradients_and_gathered_parameters():
    """Outside its collectives each framework moves the local gradients and the gathered
    parameters through HBM, priced at the HBM rate (Llama 3 8B on 8 H100s):
    FSDP1 divides the unsharded gradient in place before each reduce-scatter, in the compute
    dtype it reduces in by default (a read and a write of 2 bytes, every micro-batch);
    FSDP2 copies the gradients into its reduce-scatter buffer (2 passes, fp32 reduce dtype) and
    each all-gather's output into the parameters (2 passes of 2 bytes, 2 gathers a
    micro-batch under ZeRO-3); Megatron reads (NaN check), scales and zeroes its fp32 gradient
    buffer once a step: 4 passes of 4 bytes. Without data parallelism nothing is reduced."""
    kw = dict(model="llama-3-8b", gpu="H100-SXM", gpus=8, gbs=32, seq_len=4096)
    s, p, m = _bookkeeping_s(**kw, zero=3, framework="fsdp1")
    assert m == 4 and s == pytest.approx(m * p * 2 * 2 / H100_HBM, rel=1e-9)
    s, p, m = _bookkeeping_s(**kw, zero=3, framework="fsdp")
    assert s == pytest.approx(m * p * (2 * 4 + 2 * 2 * 2) / H100_HBM, rel=1e-9)
    s, p, m = _bookkeeping_s(**kw, zero=1, framework="megatron")
    assert s == pytest.approx(p * 4 * 4 / H100_HBM, rel=1e-9)
    assert _bookkeeping_s(**{**kw, "gpus": 1, "gbs": 4}, framework="megatron")[0] == 0.0


def test_gradient_clipping_time():
    """Clipping at norm 1 (every framework's default) adds its passes over the optimizer's
    gradient shard to the step (Llama 3 8B on 8 H100s, HBM rate): FSDP2, ZeRO-3, 3 passes of 4
    bytes over 1/8 of the parameters (28 + 12 bytes with the fused step); Megatron's
    distributed optimizer 1 pass (the norm; it scales only when the norm exceeds the threshold):
    30 + 4. --grad-clip 0 takes them away."""
    kw = dict(model="llama-3-8b", gpu="H100-SXM", gpus=8, gbs=8, seq_len=4096)
    fsdp = evaluate(make_plan(**kw, zero=3, framework="fsdp"))
    trainable = float(np.max(fsdp.memory["trainable_params"]))
    assert fsdp.time["breakdown_s"]["optimizer"] == pytest.approx(trainable / 8 * (28 + 12) / H100_HBM, rel=1e-9)
    megatron = evaluate(make_plan(**kw, zero=1, framework="megatron"))
    assert megatron.time["breakdown_s"]["optimizer"] == pytest.approx(trainable / 8 * (30 + 4) / H100_HBM, rel=1e-9)
    off = evaluate(make_plan(**kw, zero=3, framework="fsdp", grad_clip=0))
    assert off.time["breakdown_s"]["optimizer"] == pytest.approx(trainable / 8 * 28 / H100_HBM, rel=1e-9)


def test_zero2_reduces_every_micro_batch():
    """ZeRO-2 keeps only its partition of the gradients, so DeepSpeed reduces them in every
    micro-batch's backward (stage_1_and_2.py: "partition_gradients or
    is_gradient_accumulation_boundary"); ZeRO-1 once a step, at the boundary. Without overlap
    (Llama 3 8B, 16 H100s, 4 micro-batches): ZeRO-2 exposes 4 reduce-scatters and one
    parameter all-gather, ZeRO-1 one of each, and DeepSpeed's 4 passes over its 16-bit
    gradients (the copy into the bucket and the in-place division) follow the reductions;
    ZeRO-3's 6 (with the interleaving copy) run every micro-batch."""
    kw = dict(model="llama-3-8b", gpu="H100-SXM", gpus=16, gbs=64, seq_len=4096, framework="deepspeed",
              overlap_dp=False)
    for zero, reductions in ((1, 1), (2, 4)):
        result = evaluate(make_plan(**kw, zero=zero))
        d = step_derivation(result.layout)
        assert result.layout.micro_batches == 4
        coll = {k: float(np.asarray(v).ravel()[0]) for k, v in d["dp_collectives_s"].items()}
        trainable = float(np.max(result.memory["trainable_params"]))
        book = float(np.asarray(d["dp_bookkeeping_s"]).ravel()[0])
        assert book == pytest.approx(reductions * trainable * 4 * 2 / H100_HBM, rel=1e-9)
        assert result.time["breakdown_s"]["dp_comm"] == pytest.approx(
            reductions * coll["reduce_scatter"] + coll["all_gather"] + book, rel=1e-9)
    # ZeRO-3 also interleaves the bucket into one flat buffer before pre-dividing it: 6 passes
    result = evaluate(make_plan(**kw, zero=3))
    trainable = float(np.max(result.memory["trainable_params"]))
    book = float(np.asarray(step_derivation(result.layout)["dp_bookkeeping_s"]).ravel()[0])
    assert book == pytest.approx(4 * trainable * 6 * 2 / H100_HBM, rel=1e-9)


def test_pipelined_fsdp_reduces_once_a_step_and_keeps_the_stage_gathered():
    """torchtitan under pipeline parallelism keeps FSDP2's gathered parameters after the forward
    and PyTorch's pipeline schedules skip the gradient reduction and the backward reshard until
    the last micro-batch: each pipeline stage holds its parameters gathered in bf16 beside the
    shards and its gradients unsharded in the fp32 reduce dtype, which the last micro-batch's
    reduce-scatter replaces unit by unit with the shards (Llama 3 8B, 16 H100s, PP 2,
    DP 8), and gathers and reduce-scatters each unit once a step (without overlap: one of each,
    and FSDP2's copy passes once). FSDP1 under the same layout still works micro-batch by
    micro-batch."""
    kw = dict(model="llama-3-8b", gpu="H100-SXM", gpus=16, pp=2, zero=3, gbs=64, seq_len=4096, overlap_dp=False)
    result = evaluate(make_plan(**kw, framework="fsdp"))
    mem = result.memory
    p_stage, trainable = np.asarray(mem["param_count"], dtype=float), np.asarray(mem["trainable_params"], dtype=float)
    assert np.allclose(mem["params"], p_stage * (4 / 8 + 2))
    assert np.allclose(mem["grads"], trainable * 4)
    assert np.all(np.asarray(mem["zero3_gather"]) == 0)
    d = step_derivation(result.layout)
    coll = {k: float(np.asarray(v).ravel()[0]) for k, v in d["dp_collectives_s"].items()}
    t = float(np.max(trainable))
    book = t * (2 * 4 + 2 * 2) / H100_HBM
    assert float(np.asarray(d["dp_bookkeeping_s"]).ravel()[0]) == pytest.approx(book, rel=1e-9)
    assert result.time["breakdown_s"]["dp_comm"] == pytest.approx(coll["reduce_scatter"] + coll["all_gather"] + book,
                                                                 rel=1e-9)
    fsdp1 = evaluate(make_plan(**kw, framework="fsdp1"))
    assert np.all(np.asarray(fsdp1.memory["zero3_gather"]) > 0)
    d1 = step_derivation(fsdp1.layout)
    m = fsdp1.layout.micro_batches
    assert m == 8 and float(np.asarray(d1["dp_reductions"]).ravel()[0]) == m
    c1 = {k: float(np.asarray(v).ravel()[0]) for k, v in d1["dp_collectives_s"].items()}
    book1 = float(np.asarray(d1["dp_bookkeeping_s"]).ravel()[0])
    assert fsdp1.time["breakdown_s"]["dp_comm"] == pytest.approx(
        m * (2 * c1["all_gather"] + c1["reduce_scatter"]) + book1, rel=1e-9)
