"""Santurkar, Tsipras, Ilyas & Madry 2018 — How does batch normalization help optimization?

Paper: the appendix of Santurkar et al. 2018 (the main-text figures are cited by number). Entries,
one module per kind of run (each registers its entries when the catalogue imports it):

* ``vgg``: ``santurkar-fig2`` (VGG with no normalization, BN and "noisy" BN, App. A.2.1,
  Alg. 1), ``santurkar-fig6`` (ICS of Definition 2.1 per layer, VGG and DLN), ``santurkar-fig7``
  (change of the activation moments per update).
* ``dln``: ``santurkar-fig8`` (DLN activation distributions), ``santurkar-fig9`` (DLN loss
  landscape and effective β-smoothness over [1/100, 30] × lr, App. A.2.2).
* ``predictiveness``: ``santurkar-fig10`` (gradient predictiveness against the distance moved,
  from a replay of the DLNs).
* ``lp``: ``santurkar-fig11`` (ℓp normalizations: training and landscapes, Figs 11–13, the DLN
  at both readings of its rate) and ``santurkar-fig14`` (VGG activation distributions under the ℓp
  normalizations, against both readings of the caption's "normal networks"); their verdicts in
  ``lp_verdicts``.

Every compared arm runs with seeds :data:`SEEDS`; verdicts apply the rule of
:func:`bnlab.experiments.common.compare_arms` (Welch's t-test over the per-seed values, α = 0.05)
and say "inconclusive" with the smallest resolvable difference when the seeds cannot decide. The VGG
and DLN runs carry the ``hessian`` probe: the sharpness λ_max of the train-mode loss against 2/lr,
the evidence an "edge of stability" reading of the step-size results needs.

Shared runs: every VGG run of these entries uses one configuration per norm (:func:`vgg_config`) and
every DLN run one per norm (:func:`dln_config`), with all the probes any entry needs at per-probe
cadences. Identical configs have identical run ids, so after ``santurkar-fig2`` the VGG runs of
``fig6``/``fig7``/``fig11`` are already in the store and are not trained again (same for the DLN
runs of ``fig6``/``fig8``/``fig9``/``fig11``). Probes never change training (``bnlab.probes``), so a
run with them is the run without them.

Two settings differ from a literal reading of App. A.1 (both stated in the entries):

* DLN learning rate. The appendix gives 1e-6 for ‖W₁⋯W_k x − Ax‖² on 1000 samples; bnlab's
  regression loss is the mean over samples and outputs. We fix the rate by the appendix's own rule
  for the landscape range (A.2.2: the largest step, 30 × lr, "slightly smaller than the learning
  rate at which the standard network diverges"): the standard 25-layer DLN on our data diverges from
  lr ≈ 2.5e-2 (13 steps at 2.5e-2 and 3e-2; still finite at 2e-2), so lr = 1e-3 (30 × lr = 3e-2).
  That is 1e-6 × 1000, i.e. the paper's loss summed over the 1000 samples.
  ``tests/test_experiments_santurkar.py`` checks both sides of the rule on the smoke data. The
  literal conversion (the loss summed over samples and outputs: 1e-2, ``LITERAL_LR``) is the other
  reading: the DLN entries whose verdicts it can move (figs 6, 9, 10, 11) also train the DLN at
  1e-2 and hold or fail only where both readings agree (else reading-dependent, inconclusive).
* Smoke VGG inputs: digits upsampled to 16 × 16 (``digits(size=16)``), so that the VGG's stages run
  at 16, 8, 4, 2 and 1 pixels (at 8 × 8 the last two conv stages were both 1 × 1, every position a
  border); the paper's CIFAR-10 net runs its last stage at 2 × 2.
* Smoke VGG initialization. With Glorot's init (the paper's) the 11-layer ReLU VGG without BN sits
  at chance (loss 2.303) for the whole smoke budget: we measured ≥ 300 steps at lr 0.1 on digits
  with no progress; the paper's 15 000 steps are long enough to leave that plateau, 600 are not.
  Smoke runs therefore use He (Kaiming) init for all three networks; the paper preset uses Glorot.
"""
