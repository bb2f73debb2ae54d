"""Adapters for other training frameworks and model libraries (each imported only on use).

* :mod:`bnlab.integrations.lightning`: :class:`~bnlab.integrations.lightning.BnlabCallback`, a
  ``lightning.pytorch.Callback`` that runs bnlab's callbacks and probes, and
  :class:`~bnlab.integrations.lightning.StochasticWeightAveraging`, Lightning's SWA callback
  recomputing every bnlab layer's statistics (needs ``pip install lightning``);
* :mod:`bnlab.integrations.timm`: ``create_model`` with a bnlab spec, ``freeze_batch_norm_2d`` and
  ``unfreeze_batch_norm_2d``
  for bnlab's layers too (needs ``pip install timm``).

Both import beside a CPU torch whose torchvision wheel does not match it, with no manual step
(``prepare_torchvision`` runs first). docs/readme/tools.md: every tool that
finds BatchNorm by type, and what to use with bnlab's layers.
"""
