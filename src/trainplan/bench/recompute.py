"""Recompute: the memory-for-compute trade of activation checkpointing, measured on a
Llama-style decoder's training step with no, selective and full recomputation: activation
bytes saved for backward (and peak allocated memory on a GPU) against step time. The
math must not change: the loss and gradients of every variant equal those without
recomputation (checked before timing)."""

from __future__ import annotations

# (hidden, vocab, batch, seq): depth is hidden/128 (the family rule `search --max-model` uses)
SIZE = (2048, 32768, 4, 2048)
QUICK_SIZE = (512, 4096, 2, 256)
CPU_SIZE = (768, 16384, 2, 512)
VARIANTS = ("none", "selective", "full")


def _step(model, ids, targets):
    model.zero_grad(set_to_none=True)
    loss = model(ids, targets)
    loss.backward()
    return loss


def run(device: str, quick: bool, progress=None) -> list[dict]:
    import torch

    from ..search import family_model
    from ..validate.measure import SavedTensors
    from ..validate.models import DecoderLM
    from .check import relative_error
    from .timing import median_seconds

    hidden, vocab, batch, seq = QUICK_SIZE if quick else SIZE if device == "cuda" else CPU_SIZE
    spec = family_model(hidden, vocab=vocab)
    gen = torch.Generator(device="cpu").manual_seed(0)
    ids = torch.randint(0, vocab, (batch, seq), generator=gen).to(device)
    targets = torch.randint(0, vocab, (batch, seq), generator=gen).to(device)
    rows, reference = [], None
    for variant in VARIANTS:
        if progress:
            progress(f"recompute {variant}")
        torch.manual_seed(0)  # the same weights for every variant
        model = DecoderLM(spec, attention="sdpa", recompute=variant).to(device)
        with SavedTensors(model) as saved:
            loss = model(ids, targets)
        activation_bytes = saved.bytes_alive()
        loss.backward()
        loss = loss.detach()
        grads = torch.cat([p.grad.flatten() for p in model.parameters()])
        if reference is None:
            reference = (loss, grads)
        else:
            loss_err = abs(float(loss) - float(reference[0])) / abs(float(reference[0]))
            grad_err = relative_error(grads, reference[1])
            if not (loss_err <= 1e-6 and grad_err <= 1e-5):
                raise RuntimeError(f"recompute {variant} changed the math: loss error {loss_err:.1e}, "
                                   f"gradient error {grad_err:.1e}")
        peak = None
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            _step(model, ids, targets)
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated()
        seconds = median_seconds(lambda m=model: _step(m, ids, targets), device, warmup=1, repeats=5)
        rows.append({"recompute": variant, "layers": spec.layers, "hidden": hidden, "tokens": batch * seq,
                     "activation_bytes": activation_bytes, "peak_bytes": peak, "step_s": seconds})
    base = rows[0]
    for r in rows:
        r["activation_ratio"] = r["activation_bytes"] / base["activation_bytes"]
        r["time_ratio"] = r["step_s"] / base["step_s"]
    return rows
