import os
import sys
from pathlib import Path

import pytest

# Our Triton kernels run in Triton's interpreter on a CPU; Triton reads the switch when it is
# first imported, so it is set before any test (or torch.compile) can import it.
os.environ.setdefault("TRITON_INTERPRET", "1")

# Test processes share the cores (pytest-xdist): each gets its share of them for PyTorch's and
# the BLAS libraries' thread pools, read when those are first imported. Oversubscribed pools
# spin while waiting for each other: on a busy 2-core machine a float64 gradcheck of small
# tensors took 0.9 CPU-s on one thread and 8 to 16 on two. A setting of the user's own is kept.
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
THREADS = max(1, CORES // WORKERS)
if WORKERS > 1:
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(var, str(THREADS))

DATA = Path(__file__).parent / "data"


@pytest.fixture
def data_dir() -> Path:
    return DATA


# Slow tests: those that drive a browser and the modules that run PyTorch models. Marked here,
# in one place, so `pytest -m "not slow"` gives a quick pass; CI (scripts/test.sh) runs them all.
SLOW_MODULES = {"test_activations_torch", "test_hf_activations", "test_validate", "test_validate_ep_zero2",
                "test_validate_mla_lora", "test_validate_pipelining", "test_validate_sp_cp", "test_bench",
                "test_optimizer_step", "test_export_frameworks"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.module.__name__.rsplit(".", 1)[-1] in SLOW_MODULES or "browser" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)


# Multi-rank runs (validate's sharded layouts, pipelines, expert and sequence parallelism; the
# collectives bench) start their ranks with torch.multiprocessing's "spawn": a fresh interpreter
# per rank that imports torch and trainplan again, about 3 CPU-seconds before the rank does any
# work, paid by every rank of every such run. Under test they start from a forkserver (itself a
# fresh interpreter) that has imported those modules once per test process: the ranks run the
# same functions on the same pickled arguments in a process as clean as a spawned one (the
# server runs no torch op before it forks, so no thread pool is copied).
FORKSERVER_PRELOAD = ["torch", "torch.distributed", "trainplan.validate.distributed", "trainplan.validate.run",
                      "trainplan.validate.pipelining", "trainplan.validate.expert_parallel",
                      "trainplan.validate.zero2", "trainplan.validate.context_parallel",
                      "trainplan.validate.sequence", "trainplan.bench.collectives"]


def _ranks_from_a_forkserver() -> None:
    import multiprocessing

    import torch.multiprocessing as tmp

    spawn_module = sys.modules["torch.multiprocessing.spawn"]
    start = spawn_module.start_processes
    if getattr(start, "forkserver", False):
        return
    multiprocessing.get_context("forkserver").set_forkserver_preload(FORKSERVER_PRELOAD)

    def start_processes(fn, args=(), nprocs=1, join=True, daemon=False, start_method="spawn"):
        return start(fn, args, nprocs, join, daemon, "forkserver" if start_method == "spawn" else start_method)

    start_processes.forkserver = True
    spawn_module.start_processes = tmp.start_processes = start_processes


def pytest_collection_finish(session):
    # torch is imported by then if a collected module runs it; TRAINPLAN_TEST_SPAWN=1 starts the
    # ranks as the tool does, by spawn
    if "torch" in sys.modules and os.environ.get("TRAINPLAN_TEST_SPAWN") != "1":
        _ranks_from_a_forkserver()
