"""The engine: scheduling, lowering and running kernels."""
