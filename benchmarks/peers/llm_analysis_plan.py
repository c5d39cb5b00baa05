"""One llm-analysis training estimate per call, timed in CPU seconds; run in the interpreter of
the benchmark environment (scripts/bench_setup.sh installs llm-analysis there: its
huggingface-hub<0.15 pin cannot live beside transformers 5).

Prints one JSON line: {"ms_per_plan": ..., "version": ...}. The model, GPU and data-type
configurations are looked up once, as trainplan's catalog is read once; each call builds the
analysis (LLMAnalysis) and runs `training()`, as `train()` does, without its logging.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from importlib.metadata import version

from llm_analysis.analysis import ActivationRecomputation, DSZeRO, LLMAnalysis, logger
from llm_analysis.config import (
    ParallelismConfig,
    get_dtype_config_by_name,
    get_gpu_config_by_name,
    get_model_config_by_name,
)

# Llama-2-70B on 64 H100-SXM: TP 8, PP 4, DP 2, ZeRO-1, selective recomputation, global batch
# 128 x 4,096 tokens (the first case of benchmarks/plan_speed.py)
MODEL, GPU, DTYPE = "upstage_Llama-2-70b-instruct-v2", "h100-sxm-80gb", "w16a16e16"


def main() -> None:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 0.5
    logger.setLevel(logging.WARNING)
    model, gpu, dtype = get_model_config_by_name(MODEL), get_gpu_config_by_name(GPU), get_dtype_config_by_name(DTYPE)

    def one():
        analysis = LLMAnalysis(model, gpu, dtype, ParallelismConfig(tp_size=8, pp_size=4, dp_size=2, sp_size=8),
                               flops_efficiency=0.5, hbm_memory_efficiency=0.9)
        return analysis.training(global_batch_size=128, batch_size_per_gpu=1, seq_len=4096,
                                 activation_recomputation=ActivationRecomputation.SELECTIVE,
                                 ds_zero=DSZeRO.STAGE_1, mlp_gated_linear_units=True)

    for _ in range(20):
        one()
    n, t0 = 0, time.process_time()
    while time.process_time() - t0 < seconds:
        for _ in range(50):
            one()
        n += 50
    print(json.dumps({"ms_per_plan": (time.process_time() - t0) / n * 1e3, "version": version("llm-analysis")}))


if __name__ == "__main__":
    main()
