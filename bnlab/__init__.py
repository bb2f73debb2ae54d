"""bnlab: a PyTorch laboratory for batch normalization."""

__version__ = "0.1.0"
