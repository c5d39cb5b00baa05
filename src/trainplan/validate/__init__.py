"""Run a plan's model for real in PyTorch (optional extra `torch`) and measure it."""
