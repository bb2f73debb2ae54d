"""Tools that act on a model's layers: convert, fold, freeze, recollect, accumulate, the ecosystem
adapters, population statistics and progress."""
