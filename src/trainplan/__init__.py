"""trainplan: plan and measure large-language-model training on GPUs.

    from trainplan import plan, search
    plan(model="llama-3-8b", gpus=8, zero=3)   # the dict of `trainplan plan --json`

(docs/python-api.md; trainplan/api.py)
"""

__version__ = "0.1.0"
