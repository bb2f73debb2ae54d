"""bnlab: a PyTorch laboratory for batch normalization.

``pip install bnlab`` needs torch and numpy only and gives the layers (:mod:`bnlab.norms`) and the
probes (:mod:`bnlab.probes`); ``pip install 'bnlab[lab]'`` adds the ``bnlab`` command, training,
theory, the catalogue of reproductions and the report.
"""

__version__ = "0.1.0"
