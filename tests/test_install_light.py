"""`pip install bnlab` (torch and numpy only) gives the layers and the probes; the lab says what is
missing.

Each test runs a fresh interpreter in which the lab extra's packages cannot be imported
(tests/hidden_imports.py), then uses bnlab as a light install would.
"""

from __future__ import annotations

from tests.hidden_imports import LAB_PACKAGES, run_without

LAYERS_AND_PROBES = '''
import sys

import torch
from torch import nn

torch.set_num_threads(1)
import bnlab
import bnlab.norms as N
import bnlab.probes as P

gen = torch.Generator().manual_seed(0)
x = torch.randn(16, 6, generator=gen)
y = torch.randint(0, 3, (16,), generator=gen)
for info in N.describe():  # every layer of the catalogue, trained one step
    model = nn.Sequential(N.normalized(nn.Linear(6, 8), info.name), nn.ReLU(), nn.Linear(8, 3))
    N.seed_layers(model, 0)
    nn.functional.cross_entropy(model(x), y).backward()
converted = N.convert(nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3)),
                      "cbn(rho=2)")
converted(x)

model = nn.Sequential(N.normalized(nn.Linear(6, 8), "bn"), nn.ReLU(), nn.Linear(8, 3))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
lab = P.Lab(model, nn.functional.cross_entropy, probes=P.available(), optimizer=opt)
for step in range(2):  # every probe of the registry on a plain loop
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    lab.after_backward((x, y), step)
    opt.step()
    lab.after_step((x, y), step)
probes_seen = sorted({name.split("/")[1] for _, name, _ in lab.records})
print("PROBES", " ".join(probes_seen))
print("LOADED", sorted({m.partition(".")[0] for m in sys.modules} & HIDDEN))
'''


def test_layers_and_probes_work_without_the_lab_extra():
    result = run_without(LAB_PACKAGES, LAYERS_AND_PROBES)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines()
                 if line.startswith(("PROBES", "LOADED")))
    assert lines["LOADED"] == "[]"
    assert {"ics", "moments", "landscape", "grad_stats", "hessian"} <= set(lines["PROBES"].split())


def test_hidden_packages_are_really_unimportable():
    # The check above means something only if the interpreter cannot reach the lab packages.
    result = run_without(LAB_PACKAGES, '''
import importlib.util
for name in sorted(HIDDEN):
    assert importlib.util.find_spec(name) is None, name
    try:
        __import__(name)
    except ModuleNotFoundError:
        continue
    raise AssertionError(f"{name} imported")
print("OK")
''')
    assert result.returncode == 0 and result.stdout.strip() == "OK", result.stderr[-3000:]


def test_cli_without_the_lab_extra_answers_help_and_version_and_names_the_extra():
    """The light install (torch and numpy): `bnlab --help` and `--version` work, a command is one
    line naming the extra (not a 13-line traceback)."""
    code = """
import sys
from bnlab.cli import main
sys.argv = ["bnlab"] + sys.argv[1:]
main()
"""
    for args, status in ((["--help"], 0), (["--version"], 0), (["train", "--steps", "3"], 1)):
        result = run_without(LAB_PACKAGES, f"import sys; sys.argv[1:] = {args!r}\n" + code)
        assert result.returncode == status, (args, result.stdout, result.stderr[-3000:])
        if args == ["--help"]:
            assert "Commands (each needs the lab extra: pip install 'bnlab[lab]')" in result.stdout
            assert "  train " in result.stdout and "Traceback" not in result.stderr
        elif args == ["--version"]:
            import bnlab

            assert result.stdout.strip() == f"bnlab {bnlab.__version__}"
        else:
            assert result.stderr.strip() == ("error: `bnlab train` needs typer, which is "
                                             "not installed: pip install 'bnlab[lab]'")
    result = run_without(("typer",), "from bnlab.cli import app\n")
    assert ("the bnlab command needs typer, which is not installed: pip install 'bnlab[lab]'"
            in result.stderr)


def test_command_without_scipy_names_the_lab_extra():
    # typer is there but scipy is not: the theory commands (scipy imported on first use) say what to
    # install.
    result = run_without(("scipy",), '''
import sys
from bnlab.cli import app
try:
    app(["theory", "luo-zeta", "--m", "8", "--n-batches", "10"], prog_name="bnlab")
except SystemExit as exit:
    sys.exit(exit.code)
''')
    assert result.returncode == 1, (result.stdout, result.stderr[-3000:])
    assert ("error: `bnlab theory` needs scipy, which is not installed: pip install 'bnlab[lab]'"
            in result.stderr)


def test_digits_load_without_scikit_learn():
    result = run_without(("sklearn",), '''
import torch
torch.set_num_threads(1)
from bnlab import data
ds = data.load("digits", seed=0)
print("SHAPES", tuple(ds.x_train.shape), tuple(ds.x_test.shape))
''')
    assert result.returncode == 0, result.stderr[-3000:]
    assert "SHAPES (1438, 1, 8, 8) (359, 1, 8, 8)" in result.stdout
