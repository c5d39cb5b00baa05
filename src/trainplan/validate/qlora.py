"""QLoRA's frozen 4-bit base, measured with bitsandbytes' NF4 `Linear4bit` on the CPU
(bitsandbytes >= 0.48 quantizes and runs 4-bit linears without a GPU): the bytes each quantized
weight holds (the packed 4-bit codes, the per-block absmax, and with double quantization its
8-bit absmax quantized again per block of 256 with an fp32 absmax and offset, besides the two
per-tensor code tables), against the planner's conventions.toml [quantized_base] nf4_bits."""

from __future__ import annotations

from ..errors import PlanError


def _bnb():
    try:
        import bitsandbytes
    except ImportError:
        raise PlanError("finetune", "QLoRA's 4-bit base is measured with bitsandbytes: pip install bitsandbytes") \
            from None
    return bitsandbytes


def nf4_bytes(fan_in: int, fan_out: int, double_quant: bool = True) -> dict:
    """One fan_in x fan_out weight quantized to NF4 by bitsandbytes: its storages in bytes,
    by name, with `per_param` the bits per parameter without the per-tensor code tables."""
    import torch

    bnb = _bnb()
    torch.manual_seed(0)
    w = torch.randn(fan_out, fan_in) / fan_in ** 0.5
    p = bnb.nn.Params4bit(w, requires_grad=False, compress_statistics=double_quant, quant_type="nf4")
    p = p._quantize("cpu")
    qs = p.quant_state

    def nb(t):
        return t.numel() * t.element_size()
    parts = {"codes": nb(p.data), "absmax": nb(qs.absmax), "code_table": nb(qs.code)}
    if qs.nested:
        parts.update(nested_absmax=nb(qs.state2.absmax), nested_code_table=nb(qs.state2.code), offset=nb(qs.offset))
    tables = parts["code_table"] + parts.get("nested_code_table", 0)
    n = fan_in * fan_out
    return {"parts": parts, "params": n, "bytes": sum(parts.values()),
            "bits_per_param": (sum(parts.values()) - tables) * 8 / n, "blocksize": qs.blocksize,
            "version": bnb.__version__}
