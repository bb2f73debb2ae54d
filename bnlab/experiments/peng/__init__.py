"""Peng et al. — Complete batch normalization (CBN): the catalogue entries of the paper.

``tables`` (Tables 1–4), ``curves`` (Figs 4–5, from the tables' runs), ``components`` (Table 6, Fig.
7), ``figures`` (Figs 2, 8, 10), ``imagenet`` (Table 5, Fig. 6), ``theorems`` (Eq. 14, Theorem 1);
the rows, the paper's numbers and the recipes in ``common``, the tables' verdict in ``verdict``. The
catalogue imports the entry modules in the order :data:`bnlab.experiments.base.ENTRY_MODULES`
declares."""
