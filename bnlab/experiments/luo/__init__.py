"""Luo, Wang, Shao & Peng 2019 — Towards understanding regularization in batch normalization.

Paper: Luo, Wang, Shao & Peng, ICLR 2019. Entries, by module (each registers its entries when the
catalogue imports it):

``student`` and ``fig3``:

* ``luo-fig2`` — ε_gen against the load α = P/N: Eq. 14 (vanilla SGD, sign-corrected), Eqs. 15–16
  (WN + ζγ², Krogh–Hertz ridge) for ζ = 0.014, 0.25 and Eq. 13's ζ, and the BN student simulated by
  minibatch SGD (``bnlab.theory.luo.simulate_teacher_student``); the ζ that best fits the BN points.
* ``luo-fig3`` — validation loss over epochs at α = 1: vanilla SGD, BN (M = 32), WN + ζγ² (ζ =
  0.014).

``cnn``, ``fig5``, ``fold`` and ``dropout``:

* ``luo-fig4`` — the CNN of §5 (``luo_cnn``): SGD, BN, WN, WN + mean-only BN, WN + variance-only BN.
* ``luo-fig5`` — γ² (probe ``gamma``) and ζ (probe ``bn_regularization``, Theorem 1) against the
  batch size.
* ``luo-fig6`` (``fold``) — fine-tuning with BN folded into the weights (``bnlab.norms.fold``)
  against going on with BN.
* ``luo-fig7`` (``dropout``) — BN at M = 64 and 256, WN at 256, and both with dropout after each
  block (see the entry's ``smoke_changes``).

``table2``: ``luo-table2`` — Table 2's fixed points, η_max and η_eff against simulation.

Conventions: the generalization error of Fig. 2 is the excess test error of Eqs. 14–16; in Figs 3–7
"generalization error" is validation loss − training loss (§4.1, §5).

Verdicts (Figs 2–7): pure functions of per-seed numbers (``fig2_verdict`` … ``fig7_summary``), each
arm a claim compares with ≥ 3 seeds, decided by ``common.compare_arms`` (Welch's t, α = 0.05; a
claim "within a factor f" by two one-sided tests on logarithms, ``luo.common.factor_test``); an
unresolved comparison makes the verdict "inconclusive" with the effect the seeds could resolve
(power 0.8). Each verdict is computed again from the values at 2/3 of training
(``verdicts.settle``): if the two differ the compared quantity has not settled and the verdict is
"inconclusive". The figures show the compared quantity over training.
"""
