"""bnlab's Lightning adapter and timm helpers import beside the CPU torch with no manual step
first, in a fresh interpreter (as a user's script starts): ``import lightning`` alone fails there
with ``operator torchvision::nms does not exist`` when torchvision's wheel does not match torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPTS = {
    "lightning": "import bnlab.integrations.lightning as L\n"
                 "import lightning.pytorch as pl\n"
                 "assert issubclass(L.StochasticWeightAveraging,"
                 " pl.callbacks.StochasticWeightAveraging)\n"
                 "import torchmetrics, torchvision\n",
    "timm": "import bnlab.integrations.timm as T\n"
            "import timm\n"
            "model = T.create_model('resnet18', 'cbn', num_classes=3)\n"
            "import bnlab.norms as N\n"
            "assert isinstance(model.bn1, N.CompleteBatchNorm)\n",
}


@pytest.mark.parametrize("adapter", SCRIPTS)
def test_adapter_imports_in_a_fresh_interpreter(adapter):
    run = subprocess.run([sys.executable, "-c", SCRIPTS[adapter]], capture_output=True, text=True,
                         timeout=240)
    assert run.returncode == 0, run.stderr[-3000:]
