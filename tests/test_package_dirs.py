"""Every folder of Python modules under bnlab is a regular package (an ``__init__.py``): setuptools'
``packages.find`` and mkdocstrings skip namespace folders, so a wheel or the API pages would lose
them silently."""

from pathlib import Path

import bnlab


def test_every_module_folder_is_a_package():
    root = Path(bnlab.__file__).parent
    folders = {p.parent for p in root.rglob("*.py") if "__pycache__" not in p.parts}
    missing = sorted(str(f.relative_to(root.parent)) for f in folders
                     if not (f / "__init__.py").is_file())
    assert missing == []
