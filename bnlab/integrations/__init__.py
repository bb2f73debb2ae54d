"""Adapters that attach bnlab's callbacks (and so its probes) to other training frameworks.

* :mod:`bnlab.integrations.lightning`: :class:`~bnlab.integrations.lightning.BnlabCallback`, a
  ``lightning.pytorch.Callback`` (needs ``pip install lightning``; imported only on use).
"""
