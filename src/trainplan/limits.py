"""Bounds on the work one request may ask for, checked from its inputs before the work starts.

A plan's cost grows with the model's depth and the pipeline's stages (per-stage memory and
time, the stage split), a search's with the layouts it lists (every one is evaluated), so
each is capped here, once, and a request past a cap is refused with a PlanError naming the
field and the cap. The caps sit far above every real model and cluster, so they refuse only
typos (an extra zero) and requests built to exhaust a server:

* the deepest published LLMs have about 128 layers (Llama 3.1 405B: 126; GPT-3 175B: 96;
  Megatron-Turing NLG 530B: 105): MAX_LAYERS allows 32 times that;
* a pipeline stage holds at least one layer, so pipeline stages are capped by the same number;
* the largest training clusters reported hold about 100,000 GPUs (xAI Colossus): MAX_GPUS
  allows ten times that;
* a drawn pipeline timeline is an event simulation in which each operation (a forward, a
  backward) scans every stage: micro-batches x chunks x 2 or 3 operations x stages^2 steps,
  about 0.7 us of CPU each; MAX_TIMELINE_STEPS (about 0.4 s) simulates 16 micro-batches on 128
  stages (twice the deepest published pipeline, 64 stages: Narayanan et al. 2021 Table 1's 1T
  model), fewer micro-batches on deeper pipelines, and none past 512 stages;
* the searches of the largest real runs list about 10^5 layouts (DeepSeek-V3 on 16,384 H800:
  108,288; Llama 3.1 405B on 16,384 H100: 20,280; benchmarks/search_speed.py); a search lists
  at most MAX_SEARCH_LAYOUTS, about a hundred times that: some 10 s of evaluation at the
  measured 1 M layouts/s and a bounded amount of memory (about 100 bytes a layout).
"""

from __future__ import annotations

MAX_LAYERS = 4096  # transformer layers a model may have (and so pipeline stages a plan)
MAX_STAGES = MAX_LAYERS  # pipeline stages (pp): one layer a stage at the most
MAX_GPUS = 1_000_000  # GPUs of a cluster, and any one parallel degree
MAX_SEQ_LEN = 16 * 1024 * 1024  # tokens of a sequence
MAX_BATCH = 100_000_000  # sequences of a global batch or micro-batch
MAX_SEARCH_LAYOUTS = 10_000_000  # layouts one search may list (each is evaluated)
MAX_IMPORT_CHARS = 200_000  # a pasted launch script or config (published ones are a few KB)
MAX_TIMELINE_STEPS = 1 << 19  # operation x stage steps of a simulated timeline
