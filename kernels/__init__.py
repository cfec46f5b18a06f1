"""Attention backends and small kernels. Heavy imports (Triton, FlashInfer) happen lazily."""
