"""``python -m bnlab.cli ...``: the ``bnlab`` command (as torchrun launches it: ``-m bnlab.cli train``)."""

from bnlab.cli import main

main()
