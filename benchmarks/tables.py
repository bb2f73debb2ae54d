"""The benchmarks page's tables, rendered from the stored results (benchmarks/results/*.json).

    python benchmarks/tables.py           # rewrite the tables in docs/readme/benchmarks.md
    python benchmarks/tables.py --check   # exit 1 if a table differs from what the results render

Each table sits between ``<!-- bench:NAME:start -->`` and ``<!-- bench:NAME:end -->``; the prose
around it is hand-written. The layer tables merge every ``results/norms*.json`` written by
benchmarks/norms.py: for each measured setting (threads, clock, shape, layer, input dtype, mode,
reference) the newest run gives the cell (its ``date`` and ``time_utc``; on a tie, the run with more
pairs), and each table lists the runs it read with their date and commit. So a new run of
``benchmarks/norms.py`` replaces exactly the cells it measures. A results file that gives no cell
at all has been superseded by later runs: :func:`superseded` names it (and the suite fails on it).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
PAGE = REPO / "docs" / "readme" / "benchmarks.md"
LAYERS = ["native_bn", "bn", "mean_only_bn", "var_only_bn", "mbn", "cbn", "cbn(decouple=false)",
          "brn", "noisy_bn", "lp_bn(p=1)", "lp_bn(p=inf)", "si_bn", "wn"]
NOISE = "native_bn+noise eager"  # noisy_bn's own yardstick: native BN + the same noise
LARGE = (128, 64, 32, 32)
SMALL = [(1000, 10), (32, 16, 8, 8)]
MID = [(128, 16, 8, 8), (128, 32, 8, 8), (128, 16, 16, 16), (128, 32, 16, 16), (128, 64, 16, 16),
       (128, 16, 32, 32), (128, 32, 32, 32), (128, 64, 32, 32)]
HALF_SHAPES = [(32, 64, 16, 16), LARGE]
ONE_CPU, TWO_WALL = (1, "thread CPU time"), (2, "wall time")


def load(path: Path) -> dict:
    return json.loads(path.read_text())


NOT_TIMINGS = ("norms_coef_compile.json", "norms_digest.json", "norms_reading.json")


def norm_files(results: Path = RESULTS) -> list[Path]:
    """The layer runs of benchmarks/norms.py (``norms*.json``; the coefficient benchmark, the
    bit-identity digest and ``--quick`` dry runs, whose numbers mean nothing, aside)."""
    return sorted(p for p in results.glob("norms*.json")
                  if p.name not in NOT_TIMINGS and not load(p).get("quick"))


def merged_cells(results: Path = RESULTS) -> dict:
    """``{(threads, clock, shape, layer, dtype, mode, noise): (row, run)}`` from the newest run."""
    runs = [(p.name, load(p)) for p in norm_files(results)]
    runs.sort(key=lambda nr: (nr[1]["date"], nr[1].get("time_utc", ""), nr[1]["pairs"]))
    cells = {}
    for name, run in runs:
        for row in run["rows"]:
            if "ratio" not in row:
                continue
            key = (run["threads"], run["clock"], tuple(row.get("shape", run.get("shape"))),
                   row["spec"], row.get("precision", "fp32"), row["mode"],
                   row["reference"] == NOISE)
            cells[key] = (row, {"file": name, **{k: run[k] for k in ("date", "commit", "pairs")}})
    return cells


def superseded(results: Path = RESULTS) -> list[str]:
    """Layer results files none of whose cells is the newest measurement of its setting."""
    used = {run["file"] for _, run in merged_cells(results).values()}
    return [p.name for p in norm_files(results) if p.name not in used]


def dims(shape) -> str:
    return "×".join(map(str, shape))


def fmt(x, digits: int = 2) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


class Grid:
    """Cells of one setting (threads, clock), and the runs the rendered ones came from."""

    def __init__(self, cells: dict, threads: int, clock: str) -> None:
        self.cells, self.setting, self.used = cells, (threads, clock), {}
        self.row_dates: set[str] = set()  # dates of the cells read since the last ``dates()``

    def get(self, shape, layer, mode="eager", dtype="fp32", noise=False) -> dict | None:
        hit = self.cells.get((*self.setting, tuple(shape), layer, dtype, mode, noise))
        if hit is None:
            return None
        self.used[hit[1]["file"]] = hit[1]
        self.row_dates.add(hit[1]["date"])
        return hit[0]

    def ratio(self, *args, **kwargs) -> str:
        row = self.get(*args, **kwargs)
        return fmt(row and row["ratio"])

    def dates(self) -> str:
        """The dates of the runs the current row's cells came from (and start the next row)."""
        out, self.row_dates = ", ".join(sorted(self.row_dates)) or "–", set()
        return out

    def sources(self) -> str:
        runs = sorted(self.used.values(), key=lambda r: (r["date"], r["file"]))
        return "Runs read: " + "; ".join(f"`{r['file']}` ({r['date']}, {r['commit']}, "
                                         f"{r['pairs']} pairs)" for r in runs) + "."


def table(header: list[str], rows: list[list[str]], numeric_from: int = 1) -> str:
    align = ["---" if i < numeric_from else "---:" for i in range(len(header))]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows if any(c != "–" for c in r[1:])]
    return "\n".join(lines)


def layer_rows(layers=LAYERS, noise=True):
    """``(label, layer, noise)``: each layer, and noisy_bn against its own yardstick."""
    for layer in layers:
        yield f"`{layer}`", layer, False
        if noise and layer == "noisy_bn":
            yield "`noisy_bn` vs native BN + the same noise", layer, True


def render_layers(cells: dict) -> str:
    g = Grid(cells, *TWO_WALL)
    rows = []
    for label, layer, noise in layer_rows():
        eager = g.get(LARGE, layer, noise=noise)
        rows.append([label, g.ratio(LARGE, layer, noise=noise),
                     g.ratio(LARGE, layer, "compiled", noise=noise),
                     str(eager.get("ops", "–")) if eager else "–",
                     str(eager.get("ops_inside", "–")) if eager else "–", g.dates()])
    return table(["layer", "eager ×", "compiled ×", "ops", "ops inside", "measured"], rows) + \
        "\n\n" + g.sources()


def render_small(cells: dict) -> str:
    g = Grid(cells, *ONE_CPU)
    rows = []
    for label, layer, noise in layer_rows():
        row = [label, g.ratio(LARGE, layer, noise=noise),
               g.ratio(LARGE, layer, "compiled", noise=noise)]
        for shape in SMALL:
            row += [g.ratio(shape, layer, noise=noise),
                    g.ratio(shape, layer, "compiled_step", noise=noise)]
        small = g.get(SMALL[0], layer, noise=noise)
        rows.append(row + [str(small.get("ops", "–")) if small else "–", g.dates()])
    header = ["layer", f"{dims(LARGE)} eager", "compiled"]
    for shape in SMALL:
        header += [f"{dims(shape)} eager", "compiled step"]
    return table(header + [f"ops at {dims(SMALL[0])}", "measured"], rows) + "\n\n" + \
        g.sources()


def render_crossover(cells: dict, setting=ONE_CPU, shapes=MID) -> str:
    g = Grid(cells, *setting)
    shapes = [s for s in shapes if any(k[:3] == (*setting, s) and k[5] == "compiled_step"
                                       for k in cells)]
    rows = [[label] + [f"{g.ratio(s, layer, 'compiled_step')} / {g.ratio(s, layer)}"
                       .replace("– / –", "–") for s in shapes] + [g.dates()]
            for label, layer, _ in layer_rows(noise=False)
            if any(g.cells.get((*setting, s, layer, "fp32", "compiled_step", False))
                   for s in shapes)]
    return table(["layer"] + [dims(s) for s in shapes] + ["measured"], rows) + "\n\n" + \
        g.sources()


def render_half(cells: dict) -> str:
    g = Grid(cells, *ONE_CPU)
    rows = []
    for label, layer, _ in layer_rows(noise=False):
        row = [label]
        for dtype in ("bf16", "fp16"):
            row += [g.ratio(s, layer, dtype=dtype) for s in HALF_SHAPES]
        ops = {str((g.get(LARGE, layer, dtype=d) or {}).get("ops", "–")) for d in ("bf16", "fp16")}
        rows.append(row + [" / ".join(sorted(ops)), g.dates()])
    header = ["layer"] + [f"{d} {dims(s)}" for d in ("bf16", "fp16") for s in HALF_SHAPES]
    return table(header + ["ops (half)", "measured"], rows) + "\n\n" + g.sources()


def render_train(results: Path) -> str:
    rows = []
    for path in sorted(results.glob("train*.json")):
        run = load(path)
        for setting, r in run["results"].items():
            cfg = r["config"]
            mode = "compiled steps" if run.get("compiled_steps") else "eager"
            rows.append([f"`{path.name}`", f"{run['date']}, {run['commit']}", run["device"],
                         f"`{cfg['norm']}` ({mode})", f"`{setting}`",
                         fmt(r["ratio_vs_plain_same_model"]), fmt(r["ratio_vs_plain_native_bn"])])
    return table(["results", "measured", "device", "layer", "setting",
                  "engine vs plain loop, same model", "layer in the engine vs native BN in a "
                  "plain loop"], rows, numeric_from=5)


def render_gpu(results: Path) -> str:
    out = []
    for path in sorted(results.glob("gpu-*.json")):
        run = load(path)
        by = {(r["spec"], r["precision"], r["mode"], "resnet20" in r["reference"]): r["ratio"]
              for r in run["layers"] + run["resnet20_step"] if "ratio" in r}
        cols = [("fp32", "eager", False), ("fp16", "eager", False), ("bf16", "eager", False),
                ("fp32", "compiled", False), ("fp32", "eager", True), ("bf16", "eager", True),
                ("fp32", "compiled", True)]
        rows = [[f"`{layer}`"] + [fmt(by.get((layer, *c))) for c in cols] for layer in LAYERS]
        out.append(f"`{path.name}`: {run['device']}, torch {run['torch']}, {run['date']}, "
                   f"{run['commit']}, {run['pairs']} pairs\n\n" + table(
                       ["layer", "fp32 eager", "fp16 eager", "bf16 eager", "fp32 compiled",
                        "ResNet-20 step fp32 eager", "bf16 eager", "fp32 compiled"], rows))
    return "\n\n".join(out)


def render_coef_compile(results: Path) -> str:
    run = load(results / "norms_coef_compile.json")
    rows = [[f"`{r['spec']}`", dims(r["shape"])]
            + [fmt(r["ratio_to_native"][k]) for k in ("plain", "fused", "fused+compiled")]
            + [fmt(r["first_step_s"]["fused+compiled"] or None, 1)] for r in run["rows"]]
    return table(["layer", "shape", "plain ×", "fused ×", "fused + compiled coefficients ×",
                  "first compiled step (s)"], rows, numeric_from=2) + \
        f"\n\n`norms_coef_compile.json`: {run['date']}, {run['commit']}, {run['pairs']} pairs."


def render_compile_stall(results: Path) -> str:
    run = load(results / "compile_stall.json")

    def span(state, spec):
        vals = [r[state]["first_call_s"][spec] for r in run["runs"]]
        lo, hi = min(vals), max(vals)
        return f"{lo:.2f}" if f"{lo:.2f}" == f"{hi:.2f}" else f"{lo:.2f}–{hi:.2f}"

    rows = [[f"`{s}`", span("cold", s), span("warm", s)] for s in run["specs"]]
    return table(["first call of", "empty inductor cache (s)", "warm cache (s)"], rows) + \
        f"\n\n`compile_stall.json`: {run['date']}, {run['commit']}, {len(run['runs'])} repeats."


def render_eager_floor(results: Path) -> str:
    run = load(results / "eager_floor.json")
    shapes = list(dict.fromkeys(tuple(r["shape"]) for r in run["rows"]))
    by = {(r["layer"], tuple(r["shape"])): r.get("ratio") for r in run["rows"]}
    layers = list(dict.fromkeys(r["layer"] for r in run["rows"]))
    rows = [[f"`{layer}`"] + [fmt(by.get((layer, s))) for s in shapes] for layer in layers]
    return table(["candidate"] + [dims(s) for s in shapes], rows) + \
        f"\n\n`eager_floor.json`: {run['date']}, {run['commit']}, {run['pairs']} pairs."


def render_report(results: Path) -> str:
    run = load(results / "report.json")
    store, ratio = run["store"], run["median_ratio_to_today"]
    rows = [[name, fmt(seconds), "1.00" if name == "today" else fmt(ratio[name])]
            for name, seconds in run["median_s"].items()]
    return table(["bnlab report, one pass", "median (s)", "× today's"], rows) + (
        f"\n\n`report.json`: {run['date']}, {run['commit']}, {run['machine']}; a store of "
        f"{store['entries']} entries, {store['runs']:,} runs, {store['metric_rows']:,} metric "
        f"rows; {run['reads_per_pass']:,} run reads a pass, {run['passes']} passes; first pass "
        f"{fmt(run['first_pass_s'])} s. One read of a sealed run of 4,000 metric rows, its rows "
        f"hashed: {fmt(run['verify_4000_rows_ms'], 1)} ms. `bnlab report` in a new process, its "
        f"imports included: {fmt(run['cli_s'], 1)} s.")


def render_all(results: Path = RESULTS) -> dict[str, str]:
    """``{table name: Markdown}`` for every marked region of the page."""
    cells = merged_cells(results)
    return {"layers": render_layers(cells), "layers-1thread": render_small(cells),
            "crossover": render_crossover(cells),
            "crossover-2threads": render_crossover(cells, TWO_WALL, MID + [(128, 64, 32, 32)]),
            "half": render_half(cells), "train": render_train(results),
            "gpu": render_gpu(results), "coef-compile": render_coef_compile(results),
            "compile-stall": render_compile_stall(results),
            "eager-floor": render_eager_floor(results), "report": render_report(results)}


def region(name: str) -> re.Pattern:
    return re.compile(rf"(<!-- bench:{re.escape(name)}:start -->)(.*?)(<!-- bench:"
                      rf"{re.escape(name)}:end -->)", re.S)


def rewrite(text: str, tables: dict[str, str]) -> str:
    """``text`` with each marked region replaced by its table; a table without its region (or a
    region without a table) is an error naming it."""
    names = set(re.findall(r"<!-- bench:([\w-]+):start -->", text))
    if names != set(tables):
        raise ValueError(f"regions {sorted(names)} do not match tables {sorted(tables)}")
    for name, body in tables.items():
        text = region(name).sub(lambda m, b=body: f"{m.group(1)}\n{b}\n{m.group(3)}", text)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if a table (or a superseded results file) is out of date")
    args = parser.parse_args(argv)
    text = PAGE.read_text()
    new = rewrite(text, render_all())
    stale = superseded()
    if args.check:
        bad = [n for n in render_all()
               if region(n).search(text).group(2) != region(n).search(new).group(2)]
        for name in bad:
            print(f"{PAGE.relative_to(REPO)}: table {name!r} differs from the results; run "
                  "python benchmarks/tables.py", file=sys.stderr)
        for name in stale:
            print(f"benchmarks/results/{name}: superseded by later runs (no cell is its own)",
                  file=sys.stderr)
        return 1 if bad or stale else 0
    PAGE.write_text(new)
    for name in stale:
        print(f"benchmarks/results/{name}: superseded by later runs; delete it", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
