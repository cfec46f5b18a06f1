"""Building blocks shared by model files: norms, rotary embeddings, attention, fused linears."""
