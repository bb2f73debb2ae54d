"""Every script in examples/ runs, in its quick mode (BNLAB_EXAMPLE_QUICK=1: tiny sizes and steps).

The scripts check their own results (fold's gap, the probes' series, Eq. 13 against Monte Carlo), so
a zero exit status means more than "it imported".
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SCRIPTS = sorted(EXAMPLES.glob("*.py"))
# what each script must print: evidence that it reached its end with a result
EXPECTED = {
    "layer_in_your_model.py": "folded 2 norms, left 0",
    "probes_on_your_loop.py": "probe/hessian/top_eigenvalue: step 0:",
    "reproduce_an_entry.py": "verdict: inconclusive",
    "theory_against_simulation.py": "  64 ",
}


def test_every_example_has_an_expectation():
    assert SCRIPTS, f"no scripts in {EXAMPLES}"
    assert sorted(p.name for p in SCRIPTS) == sorted(EXPECTED)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_example_runs(script, tmp_path):
    env = {**os.environ, "BNLAB_EXAMPLE_QUICK": "1", "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg",
           "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert EXPECTED[script.name] in proc.stdout, proc.stdout[-2000:]
