"""Units: bytes in code, GiB (2**30) in human output (DESIGN §3)."""

GiB = 2**30
GB = 10**9


def gib(nbytes: float) -> float:
    return float(nbytes) / GiB


def fmt_gib(nbytes: float) -> str:
    return f"{gib(nbytes):.2f} GiB"


def fmt_count(n: float) -> str:
    """1_557_611_200 -> '1.56B'."""
    n = float(n)
    for div, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= div:
            return f"{n / div:.2f}{suffix}"
    return f"{n:.0f}"
