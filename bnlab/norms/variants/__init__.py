"""The normalization layers: each file one variant, saying what makes it different from batch
normalization (its coefficients, its buffers and their update, its inference rule)."""
