"""Worked numbers from the seed documents and the ZeRO paper, through the planner."""

import numpy as np
import pytest

from trainplan.errors import PlanError
from trainplan.estimate.memory import estimate_memory
from trainplan.estimate.recipe import recipe
from trainplan.plan import make_plan, resolve
from trainplan.units import GB


def static_bytes(**kw):
    """Weights + gradients + optimizer (incl. master) on the one stage of a pp=1 plan."""
    mem = estimate_memory(resolve(make_plan(**kw)))
    return float(mem["params"][0] + mem["grads"][0] + mem["optimizer"][0])


def per_param(**kw):
    r = recipe(make_plan(**kw))
    return r.weight_bytes + r.grad_bytes + r.master_bytes + r.optimizer_bytes


def test_napkin_1_4_7b_fp16_adam_is_112_gb():
    """Seed 004, Napkin Math 1.4: 7B parameters, FP16 weights and gradients, FP32 master
    weights and Adam state: 14 + 14 + 28 + 56 = 112 GB before activations."""
    assert per_param(precision="fp16", optimizer="adam") == 16
    assert 7e9 * per_param(precision="fp16", optimizer="adam") == pytest.approx(112 * GB)
    # The same recipe on a real 7B checkpoint (Llama-2-7B, 6.74B parameters): exactly 16 B/param.
    got = static_bytes(model="llama-2-7b", gpus=1, precision="fp16", optimizer="adam")
    assert got == pytest.approx(16 * 6_738_415_616)


def test_napkin_1_4_activation_factor_57():
    """Seed 004, Napkin Math 1.4: b=1, s=2048, h=4096, 32 layers, 2 bytes, activation factor
    ~57 -> 30.6 GB. 57 elements = Korthikanti's 34 + 5as/h = 114 bytes per sbh for a GPT
    layer with materialised attention and dropout (a=32); the planner gives it exactly."""
    from trainplan.estimate import activations as act
    from trainplan.estimate.memory import model_numbers
    from trainplan.specs.model import ModelSpec

    spec = ModelSpec(name="gpt-7b", source="seed 004 Napkin Math 1.4 shape", layers=32, hidden=4096,
                     heads=32, ffn=4 * 4096, mlp="gelu", vocab=50304, norm="layernorm", position="learned")
    terms = act.layer_terms(model_numbers(spec).shape, moe=False, tokens=2048, seq=2048, tp=1, sp=False,
                            act_bytes=2, linear_in_bytes=2, attention=2, recompute=0, fused=1.0, dropout=1.0)
    per_layer = sum(terms.values()) - 2048 * 2 * 2 * 4  # less the fp32 LayerNorm statistics
    assert per_layer / (2048 * 4096 * 2) == pytest.approx(57)
    assert 32 * per_layer == pytest.approx(30.6 * GB, rel=0.005)


def test_napkin_1_2_gpt2_fp32_adam_is_24_gb():
    """Seed 004, Napkin Math 1.2: GPT-2 1.5B in FP32 with Adam: 6 + 6 + 12 = 24 GB."""
    assert per_param(precision="fp32", optimizer="adam") == 16
    assert 1.5e9 * 16 == pytest.approx(24 * GB)
    got = static_bytes(model="gpt2-xl", gpus=1, precision="fp32", optimizer="adam", seq_len=1024)
    assert got == pytest.approx(16 * 1_557_611_200)  # 24.9 GB for the exact 1.558B


def test_seed_001_70b_times_16_bytes_is_1_12_tb():
    """Seed 001: BF16 weights 2 + BF16 grads 2 + FP32 master 4 + optimizer 8 = 16 bytes/param;
    70B -> 1.12 TB."""
    assert per_param(precision="bf16", optimizer="adamw") == 16
    assert 70e9 * 16 == pytest.approx(1.12e12)
    got = static_bytes(model="llama-3-70b", gpus=1, precision="bf16")
    assert got == pytest.approx(16 * 70_553_706_496)


def test_seed_003_8b_recipes():
    """Seed 003 (8B, mixed precision + Adam, no activations): fp16 weights 16 GB, fp32 master
    32 GB, Adam 64 GB, fp32 gradients 32 GB -> 144 GB, the Megatron convention
    (--accumulate-allreduce-grads-in-fp32). Its note on PyTorch AMP (fp32 weights kept as the
    parameters: 32 GB) is the `torch` convention: 32 + 32 + 64 = 128 GB."""
    n = 8e9
    mega = recipe(make_plan(framework="megatron", precision="bf16"))
    assert (mega.weight_bytes * n, mega.master_bytes * n, mega.optimizer_bytes * n, mega.grad_bytes * n) \
        == (16 * GB, 32 * GB, 64 * GB, 32 * GB)
    torch_amp = recipe(make_plan(framework="torch", precision="bf16"))
    assert (torch_amp.weight_bytes + torch_amp.grad_bytes + torch_amp.optimizer_bytes) * n == 128 * GB


@pytest.mark.parametrize("n", [8, 64])
def test_zero_stages_match_rajbhandari(n):
    """ZeRO paper §5: per-GPU model states 4Ψ+12Ψ/N (ZeRO-1), 2Ψ+14Ψ/N (ZeRO-2), 16Ψ/N (ZeRO-3)."""
    psi = 6_738_415_616
    expected = {0: 16 * psi, 1: 4 * psi + 12 * psi / n, 2: 2 * psi + 14 * psi / n, 3: 16 * psi / n}
    for stage, want in expected.items():
        got = static_bytes(model="llama-2-7b", gpus=n, zero=stage, framework="deepspeed")
        assert got == pytest.approx(want), stage


def test_megatron_distributed_optimizer_6_plus_12_over_d():
    """Megatron-LM docs (distrib_optimizer.md): with bf16 params and fp32 grads the
    distributed optimizer needs 6 + 12/d bytes per parameter."""
    psi, d = 6_738_415_616, 8
    got = static_bytes(model="llama-2-7b", gpus=d, zero=1, framework="megatron")
    assert got == pytest.approx((6 + 12 / d) * psi)


def test_fsdp2_model_states_16_over_n():
    psi, n = 8_030_261_248, 8
    got = static_bytes(model="llama-3-8b", gpus=n, zero=3, framework="fsdp")
    assert got == pytest.approx(16 * psi / n)


def test_fsdp_shard_grad_op_keeps_fp32_shards_and_the_bf16_model_gathered():
    """FSDP's SHARD_GRAD_OP (ZeRO-2; FSDP2's reshard_after_forward=False) shards the fp32
    parameters with the gradients and optimizer state, 16/N bytes per parameter as FULL_SHARD,
    and keeps each unit's bf16 copy from its forward to its backward: at the start of the
    backward the whole model, 2 bytes per parameter, lies gathered beside the shards (measured
    exactly by `trainplan validate --zero 2 --framework fsdp`, tests/test_validate.py). FSDP
    has no ZeRO-1, and runs ZeRO-3 by default."""
    psi, n = 8_030_261_248, 8
    for fw in ("fsdp", "fsdp1"):
        # FSDP shards fully unless told otherwise (FULL_SHARD); the other conventions replicate
        assert resolve(make_plan(model="llama-3-8b", gpus=n, framework=fw)).zero == 3
        mem = estimate_memory(resolve(make_plan(model="llama-3-8b", gpus=n, zero=2, framework=fw)))
        assert float(mem["params"][0]) == pytest.approx(psi * (4 / n + 2))
        assert float(mem["grads"][0] + mem["optimizer"][0]) == pytest.approx(12 * psi / n)
        with pytest.raises(PlanError) as e:
            resolve(make_plan(model="llama-3-8b", gpus=n, zero=1, framework=fw))
        assert e.value.field == "zero" and "SHARD_GRAD_OP" in e.value.rule
    assert {resolve(make_plan(model="llama-3-8b", gpus=n, framework=fw)).zero
            for fw in ("deepspeed", "megatron", "torch")} == {0}


def test_pure_16_bit_training_model_states():
    """Pure 16-bit training (--no-master-weights: a model cast to bf16) keeps 2-byte weights and
    gradients and no fp32 copy; torch.optim's AdamW creates its moments like the parameters
    (torch.zeros_like), 2 x 2 bytes: 8 bytes per parameter against mixed precision's 16.
    Transformer Engine's FusedAdam keeps them in fp32 by default (exp_avg_dtype): 12 bytes.
    Measured exactly by `trainplan validate --no-master-weights` (tests/test_validate.py)."""
    psi = 8_030_261_248
    kw = dict(model="llama-3-8b", gpus=1, framework="torch")
    assert static_bytes(**kw, master_weights=False) == pytest.approx(8 * psi)
    assert static_bytes(**kw, master_weights=False, optimizer_state_dtype="fp32") == pytest.approx(12 * psi)
    assert static_bytes(**kw) == pytest.approx(16 * psi)
    # Megatron's precision-aware optimizer with bf16 moments keeps its fp32 master copy and main
    # gradients: 2 + 4 + 4 + 2 x 2 = 14 bytes
    assert static_bytes(model="llama-3-8b", gpus=1, framework="megatron",
                        optimizer_state_dtype="bf16") == pytest.approx(14 * psi)
    lay = resolve(make_plan(**kw, master_weights=False))
    assert recipe(lay.plan).autocast_copy_bytes == 0 and recipe(lay.plan).residual_bytes == 2


def test_lora_under_zero3_gathers_the_frozen_base_but_reduces_only_the_adapters():
    """FSDP (ZeRO-3) shards LoRA's frozen base too, so it still gathers each unit (the current
    one and the prefetched next, in bf16: the largest is Llama 3.1 8B's untied output head,
    128,256 x 4,096, with the final norm), but only the adapters have gradients to reduce-scatter: the unsharded
    gradient beside them is one layer's adapters (rank 16 on all seven linears), not the unit.
    NeMo AutoModel ran this LoRA plan on one 80 GB H100 (its performance summary: micro-batch 2
    of 4,096 tokens, FSDP2, no recomputation); it fits."""
    kw = dict(model="llama-3.1-8b", gpu="H100-SXM", gpus=1, gbs=32, mbs=2, seq_len=4096, finetune="lora",
              framework="fsdp", attention="sdpa", lora_rank=16)
    lay = resolve(make_plan(**kw))
    assert lay.zero == 3
    mem = estimate_memory(lay)
    head = 128256 * 4096 + 4096
    layer_adapters = 16 * (2 * (4096 + 4096) + 2 * (4096 + 1024) + 3 * (4096 + 14336))
    assert float(mem["zero3_gather"][0]) == pytest.approx(2 * head * 2 + layer_adapters * 4)
    assert float(np.max(mem["total"])) < 80 * 2**30


def test_qlora_base_weights_4_127_bits():
    """QLoRA (Dettmers et al. 2023) §3: NF4 + double quantization = 4.127 bits/param."""
    mem = estimate_memory(resolve(make_plan(model="llama-3-8b", gpus=1, gpu="RTX-4090",
                                            finetune="qlora", lora_rank=16, seq_len=2048,
                                            recompute="full")))
    r = recipe(make_plan(finetune="qlora"))
    assert r.frozen_weight_bytes == pytest.approx(4.127 / 8)
    # bitsandbytes quantizes the nn.Linear layers; embeddings (2 x 128256 x 4096), the
    # norms and the 16-bit adapters stay in 2 bytes.
    embed_head = 2 * 128256 * 4096
    norms = 32 * 2 * 4096 + 4096
    linear = 8_030_261_248 - embed_head - norms
    adapters = 32 * 16 * (2 * (4096 + 4096) + 2 * (4096 + 1024) + 3 * (4096 + 14336))
    want = linear * 4.127 / 8 + (embed_head + norms) * 2 + adapters * 2
    assert float(mem["params"][0]) == pytest.approx(want)
    # only the adapters train: rank 16 on all seven linears of 32 layers
    assert float(mem["trainable_params"][0]) == pytest.approx(adapters)
    assert float(np.max(mem["total"])) < 24 * 2**30  # "fine-tune an 8B model on one 24 GB card"
