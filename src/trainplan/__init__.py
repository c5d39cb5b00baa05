"""trainplan: plan and measure large-language-model training on GPUs."""

__version__ = "0.1.0"
