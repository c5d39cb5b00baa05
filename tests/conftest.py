import os
from pathlib import Path

import pytest

# Our Triton kernels run in Triton's interpreter on a CPU; Triton reads the switch when it is
# first imported, so it is set before any test (or torch.compile) can import it.
os.environ.setdefault("TRITON_INTERPRET", "1")

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
