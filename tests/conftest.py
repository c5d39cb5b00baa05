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
