"""The package's layers import one way: norms → models → data → train/probes/theory → experiments →
report → cli, with no import cycle and no in-function import of bnlab's own modules.

The import graph is read with ``ast`` from the sources (module-level imports and imports inside
functions alike), so the check costs no import of torch and sees imports that only run on some
paths.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "bnlab"

# Lowest first; a module may import its own layer or a lower one. Within a layer the graph must be
# acyclic.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("foundation", ("bnlab", "bnlab.spec", "bnlab.plots", "bnlab.jsonsafe", "bnlab.callbacks",
                    "bnlab.formatting")),
    ("norms", ("bnlab.norms",)),
    ("models", ("bnlab.models",)),
    ("data", ("bnlab.data",)),
    ("train/probes/theory/store", ("bnlab.train", "bnlab.probes", "bnlab.theory", "bnlab.store",
                                    "bnlab.integrations", "bnlab.plugins")),
    ("doctor", ("bnlab.doctor",)),
    ("experiments", ("bnlab.experiments",)),
    ("report", ("bnlab.report",)),
    ("cli", ("bnlab.cli",)),  # every command; nothing below imports it
]

# In-function imports of other packages are allowed only for optional or lab-only dependencies,
# imported on first use: ray, tensorboard, mlflow, timm, torchvision (optional extras); the lab
# extra's scipy, matplotlib, tqdm, yaml, PIL, typer and sklearn, which must stay out of the light
# install (bnlab.norms, bnlab.probes; tests/test_install_light.py); fcntl and resource (POSIX
# only). A name covers its submodules.
OPTIONAL = ("ray", "torch.utils.tensorboard", "mlflow", "timm", "torchvision", "PIL", "scipy",
            "matplotlib", "tqdm", "yaml", "typer", "sklearn", "fcntl", "resource")

# Other in-function imports still present in files owned by other work streams: (module, import).
# May only shrink.
OTHER_IN_FUNCTION_ALLOWED: set[tuple[str, str]] = set()  # now empty

# torch's compiler, imported where it is first used: 1.9 s at import that the eager layers never
# need (the compiled steps are opt-in). (module, import).
DEFERRED_COMPILER: set[tuple[str, str]] = {
    ("bnlab.norms.engine.compiled_step", "torch._inductor"),
    ("bnlab.norms.engine.compiled_step", "torch._inductor.compile_fx"),
    ("bnlab.norms.engine.compiled_step", "torch._inductor.decomposition"),
    ("bnlab.norms.engine.compiled_step", "torch._functorch.partitioners"),
    ("bnlab.norms.engine.compiled_step", "torch.fx.experimental.symbolic_shapes"),
}


# In-function imports of bnlab modules still present in files owned by other work streams (issue
# 13): module -> how many. To be emptied as those files are cleaned; the test fails if one grows or
# appears.
IN_FUNCTION_ALLOWED: dict[str, int] = {}  # now empty

# Layer violations still present: (importer, imported). May only shrink (now empty).
LAYER_VIOLATIONS_ALLOWED: set[tuple[str, str]] = set()

# Import cycles (through in-function imports) in files owned by other work streams. May only shrink.
CYCLES_ALLOWED: list[set[str]] = []  # now empty


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _targets(module: str, node: ast.Import | ast.ImportFrom, is_package: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[:len(base) - (node.level - 1)]
        prefix = ".".join(base + ([node.module] if node.module else []))
    else:
        prefix = node.module or ""
    # ``from pkg import sub`` imports the submodule pkg.sub; ``from mod import name`` imports mod
    return [f"{prefix}.{a.name}" if f"{prefix}.{a.name}" in MODULES else prefix for a in node.names]


def import_graph() -> list[tuple[str, str, bool, int]]:
    """(importer, imported, inside a function?, line) for every import statement of the package."""
    edges = []
    for module, path in MODULES.items():
        is_package = path.name == "__init__.py"

        def walk(node: ast.AST, in_function: bool) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    edges.extend((module, t, in_function, child.lineno)
                                 for t in _targets(module, child, is_package))
                walk(child, in_function
                     or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

        walk(ast.parse(path.read_text(), str(path)), False)
    return edges


def _owner(target: str) -> str:
    """The bnlab module a dotted import target names (``bnlab.norms.create`` -> ``bnlab.norms``)."""
    while target not in MODULES and "." in target:
        target = target.rpartition(".")[0]
    return target


def layer_of(module: str) -> int:
    """The layer of ``module`` by its longest prefix in LAYERS; no module is exempt by its name."""
    best = None
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if module == prefix or (prefix != "bnlab" and module.startswith(prefix)):
                best = index
    assert best is not None, f"{module} is in no layer: add it to LAYERS"
    return best


def _bnlab_edges() -> list[tuple[str, str, bool, int]]:
    return [(a, _owner(b), f, line) for a, b, f, line in import_graph()
            if b == "bnlab" or b.startswith("bnlab.")]


def test_every_module_has_a_layer():
    for module in MODULES:
        layer_of(module)


def test_no_module_imports_a_later_layer():
    violations = {(a, b) for a, b, _, _ in _bnlab_edges() if layer_of(b) > layer_of(a)}
    new = violations - LAYER_VIOLATIONS_ALLOWED
    assert not new, \
        "imports against the layer order " + " → ".join(n for n, _ in LAYERS) + f": {sorted(new)}"
    assert not LAYER_VIOLATIONS_ALLOWED - violations, \
        "fixed: remove from LAYER_VIOLATIONS_ALLOWED " \
        f"{sorted(LAYER_VIOLATIONS_ALLOWED - violations)}"


def test_no_import_cycle():
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for a, b, _, _ in _bnlab_edges():
        # every module imports its package; not a cycle
        if b != a and not (b == "bnlab" and a != "bnlab"):
            graph[a].add(b)
    # Tarjan's strongly connected components: a component of more than one module is a cycle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 and set(component) not in CYCLES_ALLOWED:
                cycles.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def test_in_function_imports_only_for_optional_dependencies():
    seen: set[tuple[str, int]] = set()  # (module, line): one per import statement
    others = []
    for a, b, in_function, line in import_graph():
        if not in_function:
            continue
        if b == "bnlab" or b.startswith("bnlab."):
            seen.add((a, line))
        elif not any(b == o or b.startswith(o + ".") for o in OPTIONAL):
            others.append((a, b))
    counts: dict[str, int] = {}
    for module, _ in seen:
        counts[module] = counts.get(module, 0) + 1
    grown = {m: n for m, n in counts.items() if n > IN_FUNCTION_ALLOWED.get(m, 0)}
    assert not grown, f"in-function imports of bnlab modules (import them at module level): {grown}"
    shrunk = {m: n for m, n in IN_FUNCTION_ALLOWED.items() if counts.get(m, 0) < n}
    assert not shrunk, \
        f"fewer in-function imports now: lower IN_FUNCTION_ALLOWED to {shrunk} (actual counts)"
    new = sorted(set(others) - OTHER_IN_FUNCTION_ALLOWED - DEFERRED_COMPILER)
    assert not new, \
        f"in-function imports of non-optional packages (import them at module level): {new}"
    gone = sorted(OTHER_IN_FUNCTION_ALLOWED - set(others))
    assert not gone, f"fixed: remove from OTHER_IN_FUNCTION_ALLOWED {gone}"


def test_figure_helpers_import_nothing_of_bnlab():
    # The figure helpers sit below the catalogue; importing them must not import any experiment
    # module.
    edges = _bnlab_edges()
    assert not [b for a, b, _, _ in edges if a == "bnlab.plots"]


def test_architecture_picture_draws_these_layers():
    """docs/architecture_figure.py draws the layers this test enforces, and every package is on
    it."""
    import importlib.util

    path = PACKAGE.parent / "docs" / "architecture_figure.py"
    spec = importlib.util.spec_from_file_location("architecture_figure", path)
    figure = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(figure)
    drawn = [(layer, sorted(name for name, _ in packages)) for layer, packages in figure.LAYERS]
    enforced = [(layer, sorted(p for p in packages if p != "bnlab")) for layer, packages in LAYERS]
    assert drawn == enforced
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert {f"bnlab.{p}" for p in packages} <= {name for _, names in drawn for name in names}
    page = (PACKAGE.parent / "docs" / "readme" / "architecture.md").read_text()
    assert "../figures/architecture.png" in page \
        and (PACKAGE.parent / "docs" / "figures" / "architecture.png").is_file()
