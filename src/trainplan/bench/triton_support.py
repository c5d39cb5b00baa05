"""Whether our Triton kernels can run here, and how: compiled on a CUDA device, or in
Triton's interpreter (TRITON_INTERPRET=1, NumPy on the CPU), where they are checked for
correctness but not timed: an interpreted kernel's time says nothing about the hardware."""

from __future__ import annotations

import os
import sys


class Unavailable(Exception):
    """Our Triton kernels cannot run here; the message says why."""


def kernels(device: str):
    """The `triton_kernels` module for `device`, or raise Unavailable with the reason."""
    if device == "cpu":
        prepare_interpreter()
    try:
        import triton.language as tl
    except ImportError:
        raise Unavailable("Triton is not installed (pip install 'trainplan[triton]')") from None
    # Triton's own library kernels (tl.rand, ...) are decorated when triton is first imported
    interpreted = type(tl.rand).__name__ == "InterpretedFunction"
    if interpreted != (device == "cpu"):
        mode = "interpreted" if interpreted else "compiled"
        raise Unavailable(f"Triton was loaded {mode} earlier in this process; run {device} in a new process")
    from . import triton_kernels

    return triton_kernels


def kernels_or_reason(device: str):
    """(the kernels module, None), or (None, "unavailable: <why>") for a suite's note."""
    try:
        return kernels(device), None
    except Unavailable as exc:
        return None, f"unavailable: {exc}"


def prepare_interpreter() -> None:
    """Ask for Triton's interpreter before anything (torch.compile included) imports Triton."""
    if "triton" not in sys.modules:
        os.environ.setdefault("TRITON_INTERPRET", "1")


def timed(device: str) -> bool:
    """Triton kernels are timed only when compiled for a GPU."""
    return device == "cuda"
