"""Hardware evaluation: measure what an accelerator (or the CPU) really does and write a
calibrated profile the planner uses in place of the catalog defaults (`trainplan bench`).

Suites: `gemm` (matmul TFLOP/s by dtype and size, against the dense peak), `memory` (copy
and triad bandwidth), `alignment` (padded vs unpadded GEMM dimensions) and `recompute`
(activation checkpointing's memory saved against time spent). Every kernel's output is poisoned before the run and checked
against a float64 reference on fresh random inputs; times are medians after warm-up.
"""
