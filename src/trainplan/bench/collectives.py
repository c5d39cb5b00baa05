"""Collectives: all-reduce, all-gather and reduce-scatter bandwidth over message sizes, one
process per GPU (NCCL), or on a CPU between local gloo processes, with the conventions of
nccl-tests (PERFORMANCE.md): `size` is the larger buffer of the operation (the all-reduce
buffer, the all-gather output, the reduce-scatter input), algorithm bandwidth = size / time,
and bus bandwidth = algbw x 2(n-1)/n for all-reduce and x (n-1)/n for the other two, the
rate each link must sustain in a ring, comparable with the hardware's link bandwidth.
Each operation's result is checked against a float64 reduction of every rank's inputs."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

OPS = ("all_reduce", "all_gather", "reduce_scatter")
SIZES = tuple(1 << e for e in range(12, 31, 2))  # 4 KiB ... 1 GiB (GPU)
CPU_SIZES = tuple(1 << e for e in range(12, 25, 2))  # 4 KiB ... 16 MiB
QUICK_SIZES = tuple(1 << e for e in range(12, 21, 4))  # 4 KiB, 64 KiB, 1 MiB
CPU_WORLD, QUICK_WORLD = 4, 2
TOLERANCE = 1e-6  # fp32 sums of at most 8 terms


def bus_factor(op: str, world: int) -> float:
    """nccl-tests' bus bandwidth factor."""
    return 2 * (world - 1) / world if op == "all_reduce" else (world - 1) / world


def _rank_data(rank: int, elements: int, seed: int):
    import torch

    return torch.randn(elements, generator=torch.Generator().manual_seed(seed * 1009 + rank))


def _expected(op: str, rank: int, world: int, elements: int, seed: int):
    """The float64 result rank `rank` should hold, from every rank's inputs."""
    import torch

    if op == "all_gather":
        return torch.cat([_rank_data(r, elements // world, seed).double() for r in range(world)])
    total = sum(_rank_data(r, elements, seed).double() for r in range(world))
    if op == "all_reduce":
        return total
    chunk = elements // world
    return total[rank * chunk:(rank + 1) * chunk]


def _worker(rank: int, world: int, port: int, device: str, sizes: tuple, repeats: int, out_dir: str) -> None:
    import statistics
    import time

    import torch
    import torch.distributed as dist

    from .check import relative_error

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if device == "cuda":
        torch.cuda.set_device(rank)
    else:
        torch.set_num_threads(1)
    dist.init_process_group("nccl" if device == "cuda" else "gloo", rank=rank, world_size=world)
    dev = torch.device("cuda", rank) if device == "cuda" else torch.device("cpu")
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    # the *_single names replace the *_tensor ones in recent PyTorch
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    results = []
    try:
        for op in OPS:
            for seed, size in enumerate(sizes):
                elements = size // 4 // world * world  # fp32, divisible among the ranks
                if op == "all_gather":
                    src = _rank_data(rank, elements // world, seed).to(dev)
                    dst = torch.full((elements,), float("nan"), device=dev)
                    call = lambda s=src, d=dst: gather(d, s)  # noqa: E731
                elif op == "reduce_scatter":
                    src = _rank_data(rank, elements, seed).to(dev)
                    dst = torch.full((elements // world,), float("nan"), device=dev)
                    call = lambda s=src, d=dst: scatter(d, s)  # noqa: E731
                else:
                    dst = _rank_data(rank, elements, seed).to(dev)  # summed in place (fp32 holds 8^22)
                    call = lambda d=dst: dist.all_reduce(d)  # noqa: E731
                call()
                sync()
                ref = _expected(op, rank, world, elements, seed)
                err = relative_error(dst, ref)
                times = []
                for i in range(repeats + 2):
                    dist.barrier()
                    sync()
                    t0 = time.perf_counter()
                    call()
                    sync()
                    if i >= 2:  # two warm-up runs
                        times.append(time.perf_counter() - t0)
                results.append({"op": op, "size": elements * 4, "seconds": statistics.median(times), "rel_error": err})
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))
        dist.barrier()  # no rank tears down the group while another still has work in flight
    finally:
        dist.destroy_process_group()


def run(device: str, quick: bool, progress=None) -> list[dict]:
    import torch
    import torch.multiprocessing as mp

    from ..validate.distributed import free_port

    if device == "cuda":
        world = torch.cuda.device_count()
        if world < 2:
            return [{"op": op, "world": world, "size": None, "seconds": None, "algbw_gbs": None, "busbw_gbs": None,
                     "rel_error": None, "note": "needs two or more GPUs"} for op in OPS]
        sizes = QUICK_SIZES if quick else SIZES
    else:
        world = QUICK_WORLD if quick else CPU_WORLD
        sizes = QUICK_SIZES if quick else CPU_SIZES
    if progress:
        progress(f"collectives: {world} {'GPUs (NCCL)' if device == 'cuda' else 'gloo processes'}")
    with tempfile.TemporaryDirectory() as out:
        mp.spawn(_worker, args=(world, free_port(), device, sizes, 5 if quick else 20, out), nprocs=world, join=True)
        per_rank = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(world)]
    rows = []
    for measured in zip(*per_rank, strict=True):
        first = measured[0]
        err = max(m["rel_error"] for m in measured)
        if not err <= TOLERANCE:  # NaN: a rank's output was never written
            raise RuntimeError(f"{first['op']} of {first['size']} bytes is wrong: relative error {err:.2e} > "
                               f"{TOLERANCE:.0e}")
        seconds = max(m["seconds"] for m in measured)  # the collective ends when its slowest rank does
        algbw = first["size"] / seconds / 1e9
        rows.append({"op": first["op"], "world": world, "size": first["size"], "seconds": seconds,
                     "algbw_gbs": algbw, "busbw_gbs": algbw * bus_factor(first["op"], world), "rel_error": err,
                     "note": None})
    return rows
