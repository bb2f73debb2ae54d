"""Arora, Li & Lyu 2019 — Theoretical analysis of auto rate-tuning by batch normalization.

``entries`` (App. D.1–D.3, verdicts in ``verdicts``) and ``rates`` (Theorems 3.1 and 4.2). The
catalogue imports the entry modules in the order :data:`bnlab.experiments.base.ENTRY_MODULES`
declares.
"""
