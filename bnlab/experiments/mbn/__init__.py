"""Yong et al. 2020 — Momentum batch normalization for deep learning with small batch size.

``entries`` (``mbn-batch-size``: measure, judge, render), ``arms`` (its arms beyond BN and MBN:
BRN, GroupNorm, synced BN, recollected BN), ``page`` (the docs page "Small batches: what to use"
from a stored run) and ``theorems`` (supplementary Theorems 1–2). The catalogue imports the entry
modules in the order :data:`bnlab.experiments.base.ENTRY_MODULES` declares.
"""
