"""``python -m bnlab.cli ...``: the ``bnlab`` command (as torchrun launches it: ``-m bnlab.cli
train``).

The program is named ``bnlab``, as the console script is, so usage lines and the resume hint of an
interrupted run (``bnlab.train.loop``) name the command a user types.
"""

import sys

from bnlab.cli import main

sys.argv[0] = "bnlab"
main()
