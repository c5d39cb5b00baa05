"""Accelerator spec: memory, bandwidth, dense peak per dtype, links, power, price."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ..units import GiB

Dtype = Literal["fp32", "tf32", "bf16", "fp16", "fp8"]


class GPUSpec(BaseModel):
    """One accelerator. FLOP/s are dense (no sparsity); bandwidths are decimal units."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    source: str = Field(min_length=1)
    aliases: tuple[str, ...] = ()
    vendor: str = ""
    memory_gib: float = Field(gt=0, le=100_000)
    hbm_tbs: float = Field(gt=0, description="memory bandwidth, TB/s")
    peak_tflops: dict[str, float] = Field(description="dense TFLOP/s by dtype")
    scale_up_gbs: float = Field(default=0, ge=0, description="NVLink-class, per GPU, bidirectional GB/s")
    nic_gbps: float = Field(default=0, ge=0, description="scale-out network per GPU, Gb/s")
    scale_up_domain: int = Field(default=8, ge=1, le=1_000_000,
                                 description="GPUs the scale-up link joins (a server's NVLink/xGMI, an NVL72 rack, a "
                                 "TPU pod's ICI): the plan's GPUs per node unless it gives its own")
    tdp_w: float = Field(default=0, ge=0)
    price_usd_per_hour: float | None = Field(default=None, ge=0)
    sms: int | None = None
    l2_mb: float | None = None
    unverified: tuple[str, ...] = Field(default=(), description="fields without a primary source")
    notes: str = ""

    @property
    def capacity_bytes(self) -> float:
        return self.memory_gib * GiB

    def peak(self, dtype: str) -> float | None:
        """Dense peak FLOP/s for a dtype, or None when the part has no such units."""
        v = self.peak_tflops.get(dtype)
        return None if v is None else v * 1e12
