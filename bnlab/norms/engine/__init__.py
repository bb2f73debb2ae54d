"""The engine the layers run on: batch statistics, the fused, plain and compiled routes, synced
statistics and the non-finite guard."""
