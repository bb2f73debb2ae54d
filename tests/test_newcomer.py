"""A newcomer's first hour: a demo that stays fast on shared cores, timm and torchvision
without test-only workarounds, probes on compiled models, defaults that train, a light front door.

Each test states the outside reference it checks against: the numbers of a sequential run, torch's
own modules (torch.compile, torch.func), a fresh interpreter, Ioffe's published schedule.
"""

from __future__ import annotations

import importlib.util
import io
import os
import subprocess
import sys

import pytest
import torch

from bnlab.experiments import parallel, runner
from bnlab.store import Store

SMALL = dict(
    model="mlp",
    model_options={"depth": 2, "width": 16},
    data="digits",
    steps=30,
    batch_size=64,
    norm="bn",
    lr=0.1,
)


# ---- 1. the demo: parallel runs, one thread each, the same numbers ------------------------


def test_free_cores_is_the_affinity_less_the_busy_cores(monkeypatch):
    monkeypatch.delenv(parallel.WORKERS_ENV, raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    monkeypatch.setattr(parallel, "cpu_times", lambda stat="": None)  # no /proc/stat: load average
    monkeypatch.setattr(os, "getloadavg", lambda: (1.2, 0.0, 0.0))
    assert parallel.free_cores() == 3  # 4 CPUs, one busy
    monkeypatch.setattr(os, "getloadavg", lambda: (3.9, 0.0, 0.0))
    assert parallel.free_cores() == 1  # never fewer than one
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    assert parallel.free_cores() == 4
    monkeypatch.setenv(parallel.WORKERS_ENV, "2")
    assert parallel.free_cores() == 2
    monkeypatch.setenv(parallel.WORKERS_ENV, "two")
    with pytest.raises(ValueError, match="BNLAB_WORKERS must be a positive integer"):
        parallel.free_cores()


def _metrics(runs_dir, records):
    with Store(runs_dir / "bnlab.db") as store:
        return [store.metrics(r["id"]) for r in records], [
            store.get_run(r["id"])["env"] for r in records
        ]


def test_a_sweep_gives_the_same_numbers_on_two_workers_as_on_one_and_records_one_thread(
    tmp_path, monkeypatch
):
    """The reference: the same configs trained one after another in this process. Two worker
    processes must give bitwise the same metric series, and every run trains with one thread,
    whatever this process's thread count (recorded in the run's env)."""
    monkeypatch.setattr(parallel, "MIN_POOL_STEPS", 0)  # pool even for two short runs
    configs = [dict(SMALL, seed=seed) for seed in (0, 1)]
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        seq_dir, par_dir = tmp_path / "seq", tmp_path / "par"
        seq = runner.run_sweep(
            [dict(c, runs_dir=str(seq_dir)) for c in configs], workers=1, progress=False
        )
        assert torch.get_num_threads() == 2  # restored after the sweep
        par = runner.run_sweep(
            [dict(c, runs_dir=str(par_dir)) for c in configs], workers=2, progress=False
        )
    finally:
        torch.set_num_threads(before)
    assert [r["status"] for r in seq + par] == ["finished"] * 4, [r.get("error") for r in seq + par]
    seq_metrics, seq_env = _metrics(seq_dir, seq)
    par_metrics, par_env = _metrics(par_dir, par)
    assert seq_metrics == par_metrics and seq_metrics[0] != seq_metrics[1]
    assert [e["threads"] for e in seq_env + par_env] == [1, 1, 1, 1]


def test_sweep_progress_prints_an_eta_line_per_finished_run(monkeypatch):
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    bar = parallel.SweepProgress(4, "entry", enabled=True)
    bar.step(0, 50, 100)
    bar.finished(1, "finished")
    bar.step(1, 10, 100)  # a late report of a finished run changes nothing
    assert bar.progress == pytest.approx(1.5)
    lines = err.getvalue().splitlines()
    assert lines and lines[-1].startswith("entry: 1.5/4 runs") and "ETA" in lines[-1]


# ---- 2. timm and torchvision through the library's helper ---------------------------------

VISION_CODE = """
import torch
torch.set_num_threads(1)
try:
    import timm  # the plain import: may fail where torchvision's C++ ops do not match torch
    print("PLAIN ok")
except RuntimeError as err:
    print("PLAIN failed:", err)
import sys
for name in [m for m in sys.modules if m.split(".")[0] in ("timm", "torchvision")]:
    del sys.modules[name]
from bnlab.models.vision_compat import VisionOpsUnavailable, import_timm, ops_placeholder_active
timm = import_timm()
net = timm.create_model("resnet18", num_classes=3).eval()
g = torch.Generator().manual_seed(0)
with torch.no_grad():
    out = net(torch.randn(2, 3, 32, 32, generator=g))
print("SHAPE", tuple(out.shape), bool(torch.isfinite(out).all()))
if ops_placeholder_active():
    try:
        torch.ops.torchvision.nms(torch.zeros(1, 4), torch.zeros(1), 0.5)
    except VisionOpsUnavailable as err:
        print("NMS refused:", str(err)[:60])
"""


def test_timm_imports_through_the_library_helper_in_a_fresh_interpreter():
    """The reference is timm's own model in a new interpreter: built and run through
    bnlab.models.vision_compat.import_timm (no pytest), whatever torchvision's C++ operators."""
    if importlib.util.find_spec("timm") is None:
        pytest.skip("timm is not installed (pip install -e '.[test]')")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-c", VISION_CODE], capture_output=True, text=True, timeout=300, env=env
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "SHAPE (2, 3) True" in result.stdout
    if "PLAIN failed" in result.stdout:  # this environment has the mismatch the helper is for
        assert "torchvision::nms does not exist" in result.stdout
        assert "NMS refused: torchvision::nms is a placeholder" in result.stdout


# ---- 3. probes on a compiled model ---------------------------------------------------------


def _probe_run(compile_backend: str | None) -> list[tuple[int, str, float]]:
    import bnlab.probes as P

    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, 2)
    )
    run_model = model if compile_backend is None else torch.compile(model, backend=compile_backend)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = torch.nn.CrossEntropyLoss()
    lab = P.Lab(
        run_model,
        loss_fn,
        optimizer=opt,
        probes=[P.create("hessian", every=2, iters=4, samples=1), P.create("ics", every=2)],
    )
    for step in range(3):
        x = torch.randn(16, 6, generator=gen)
        y = torch.randint(0, 2, (16,), generator=gen)
        opt.zero_grad()
        loss_fn(run_model(x), y).backward()
        lab.after_backward((x, y), step)
        opt.step()
        lab.after_step((x, y), step)
    return [(s, n, v) for s, n, v in lab.records if not n.endswith("/seconds")]


def test_lab_measures_a_compiled_model_through_its_eager_module():
    """The reference is the same loop on the eager module. torch.compile through AOTAutograd
    (backend aot_eager: the default inductor's autograd, without its C++ compile) has no double
    backward, which the hessian probe needs: the Lab measures through ``_orig_mod``."""
    from bnlab.probes.compiled import eager_module, is_compiled

    eager = _probe_run(None)
    compiled = _probe_run("aot_eager")
    assert [n for _, n, _ in compiled] == [n for _, n, _ in eager]
    assert any("hessian/top_eigenvalue" in n for _, n, _ in compiled)
    for (_, name, a), (_, _, b) in zip(compiled, eager):
        assert a == pytest.approx(b, rel=1e-4, abs=1e-6, nan_ok=True), name
    net = torch.nn.Linear(2, 2)
    assert is_compiled(torch.compile(net)) and eager_module(torch.compile(net)) is net
    assert not is_compiled(net) and eager_module(net) is net


def test_bnlab_train_compile_runs_the_hessian_probe(tmp_path, monkeypatch):
    """``bnlab train --compile`` (config compile=True) with the hessian probe: the training step is
    compiled (AOTAutograd, as inductor's), the probe measures through the eager module and the
    eigenvalue equals the uncompiled run's."""
    import functools

    import bnlab.train as train

    config = dict(SMALL, steps=4, seed=0, probes=["hessian(every=2, iters=4, samples=1)"])
    eager = train.run(dict(config, runs_dir=str(tmp_path / "eager")), progress=False)
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="aot_eager"))
    compiled = train.run(
        dict(config, compile=True, runs_dir=str(tmp_path / "compiled")), progress=False
    )
    assert compiled.status == "finished", compiled.error
    name = "probe/hessian/top_eigenvalue"
    with Store(tmp_path / "compiled" / "bnlab.db") as store:
        ours = store.metrics(compiled.id, names=[name])[name]
    with Store(tmp_path / "eager" / "bnlab.db") as store:
        ref = store.metrics(eager.id, names=[name])[name]
    assert len(ours) == 2 and [s for s, _ in ours] == [s for s, _ in ref]
    assert [v for _, v in ours] == pytest.approx([v for _, v in ref], rel=1e-4)


# ---- 4. defaults that train ----------------------------------------------------------------


def test_brn_default_warm_up_is_ioffes_schedule_scaled_to_the_run():
    import bnlab.norms as N
    from bnlab.norms.variants.renorm import ioffe_schedule

    # Ioffe 2017 §4 as printed: relax from 5k steps, r_max = 3 at 40k, d_max = 5 at 25k
    assert N.create("brn", 4).schedule() == (5000, 40000, 25000)
    assert ioffe_schedule(1000, 0.1) == (62, 500, 312)  # r_max reached at half the run, same ratios
    assert ioffe_schedule(20, 0.1) == (30, 30, 30)  # never before the running averages settle
    assert N.create("brn(relax_from=0)", 4).schedule() == (0, 0, 0)  # no warm-up, by hand
    assert N.create("brn(relax_from=5, r_max_at=15, d_max_at=15)", 4).schedule() == (5, 15, 15)


def test_brn_with_defaults_trains_like_batchnorm_in_a_short_run(tmp_path):
    """The reference is torch's own BatchNorm (``native_bn``) on the same 20-step run: brn's default
    warm-up keeps r = 1, d = 0 until its running averages have settled, so the training losses
    agree; without a warm-up (the old default) the corrections against unsettled averages
    raise the loss (measured: 1.60 vs 1.36 at step 20)."""
    import bnlab.train as train

    base = dict(
        model="mlp",
        model_options={"depth": 4, "width": 64},
        data="digits",
        steps=20,
        batch_size=32,
        lr=0.1,
        seed=0,
        runs_dir=str(tmp_path),
    )
    losses = {}
    for norm in ("native_bn", "brn", "brn(relax_from=0)"):
        record = train.run(dict(base, norm=norm), progress=False)
        with Store(tmp_path / "bnlab.db") as store:
            losses[norm] = [
                v for _, v in store.metrics(record.id, names=["train_loss"])["train_loss"]
            ]
    assert losses["brn"] == pytest.approx(losses["native_bn"], rel=1e-4)
    assert losses["brn(relax_from=0)"][-1] > losses["native_bn"][-1] * 1.05


def _lp_inf_ranks(rank: int, world: int) -> dict[str, float]:
    """Synced lp_bn(p=inf) on this rank's 8 of 16 integer-valued samples (exact ties everywhere)
    against the unsynced layer on all 16, fused and plain (the reference: one process)."""
    import bnlab.norms as N
    import bnlab.norms.engine.route as norms_route

    gen = torch.Generator().manual_seed(3)
    x = torch.randint(0, 4, (16, 3, 4, 4), generator=gen).float()
    w = torch.randn(16, 3, 4, 4, generator=gen)
    lo, hi = rank * 8, rank * 8 + 8
    out = {}
    for path, threshold in (("fused", 0), ("plain", 1 << 60)):
        norms_route.FUSED_MIN_NUMEL = threshold
        torch.manual_seed(0)
        ref = N.create("lp_bn(p=inf, topk=10)", 3)
        synced = N.convert_sync(N.create("lp_bn(p=inf, topk=10)", 3))
        synced.load_state_dict(ref.state_dict())
        x_ref, x_loc = x.clone().requires_grad_(), x[lo:hi].clone().requires_grad_()
        (ref(x_ref) * w).sum().backward()
        (synced(x_loc) * w[lo:hi]).sum().backward()
        out[path] = float((x_loc.grad - x_ref.grad[lo:hi]).abs().max())
    return out


def test_synced_lp_inf_equals_one_process_under_exact_ties():
    """Top-k ties (integer-valued inputs: digits pixels, ReLU zeros) are broken by the lowest index
    of the whole batch everywhere, so 2 processes × 8 pick the same entries as 1 × 16 and the input
    gradients agree (a different pick moves the ℓ∞ scale's gradient to another entry)."""
    from tests.distributed_harness import run_ranks

    results = run_ranks(2, _lp_inf_ranks, timeout=120)
    for rank in results:
        assert rank["fused"] < 1e-5 and rank["plain"] < 1e-5, results


def test_the_forgotten_track_warnings_point_at_the_users_line():
    """Python's own attribution (warnings' filename and lineno) must be this file's line that ran
    the model, not torch's container.py, however deep the layer sits."""
    import warnings

    import bnlab.norms as N

    model = torch.nn.Sequential(torch.nn.Sequential(N.create("mbn", 3)), N.create("cbn", 3))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = sys._getframe().f_lineno + 1
        model(torch.randn(8, 3))
    found = {str(w.message)[:3]: (w.filename, w.lineno) for w in caught}
    assert found.get("mbn") == (__file__, line) and found.get("cbn") == (__file__, line), found


# ---- 5. the front door ---------------------------------------------------------------------


def test_make_docs_installs_only_the_docs_extra():
    """The reference is pyproject.toml's [docs] extra: `make -n docs` (what make would run) installs
    exactly those packages — no torch, no [lab]/[test] extras."""
    import shutil
    import tomllib
    from pathlib import Path

    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    repo = Path(__file__).resolve().parents[1]
    docs = tomllib.loads((repo / "pyproject.toml").read_text())["project"]["optional-dependencies"][
        "docs"
    ]
    out = subprocess.run(
        ["make", "-n", "-B", "docs", "VENV=/nonexistent/venv"],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    installs = [line for line in out.splitlines() if "pip install" in line]
    assert len(installs) == 1 and all(f'"{req}"' in installs[0] for req in docs), out
    assert "torch" not in out and ".[" not in out, out


def test_a_run_reports_its_steps_to_the_sweep_progress(tmp_path):
    """The engine's own step count (the run's length from its config) reaches the progress bar
    while the run trains, not only when it ends."""
    seen: list[tuple[int, int, int]] = []
    config = dict(SMALL, steps=12, seed=0, runs_dir=str(tmp_path))
    monkey = parallel.REPORT_SECONDS
    parallel.REPORT_SECONDS = 0.0
    try:
        record = runner._train_one(config, callbacks=[parallel.StepReporter(7, seen.append)])
    finally:
        parallel.REPORT_SECONDS = monkey
    assert record["status"] == "finished"
    assert seen[0] == (7, 0, 12) and (7, 12, 12) in seen and len(seen) >= 12


def test_demo_figures_name_their_axes_for_people_and_keep_legends_off_the_curves():
    """matplotlib's own geometry is the reference: after drawing, no plotted point lies inside
    the legend's box; recorded metric names on the axes are spelled out."""
    import matplotlib.pyplot as plt

    from bnlab.plots import panel_figure, readable

    xs = [i / 200 for i in range(201)]  # 9 lines fanning over the whole axes: no free corner inside
    series = {f"line {k}": (xs, [(x * k + (1 - x) * (8 - k)) / 8 for x in xs]) for k in range(9)}
    fig = panel_figure([{"series": series, "xlabel": "step", "ylabel": "epoch_train_loss"}])
    try:
        fig.canvas.draw()
        ax = fig.axes[0]
        box = ax.get_legend().get_window_extent()
        points = [p for line in ax.get_lines() for p in ax.transData.transform(line.get_xydata())]
        assert not any(box.contains(float(px), float(py)) for px, py in points)
        assert ax.get_ylabel() == "training loss (epoch mean)"
    finally:
        plt.close(fig)
    assert (
        readable("test_accuracy") == "test accuracy"
        and readable("top_eigenvalue") == "top eigenvalue"
    )
    assert readable("η (fraction in range)") == "η (fraction in range)"


def test_api_pages_lead_with_what_users_call_and_sphinx_roles_render_as_code():
    """The order is the page's own ``:::`` directives (what mkdocstrings renders, in order)."""
    import importlib.util as util
    from pathlib import Path

    docs = Path(__file__).resolve().parents[1] / "docs"
    order = [line[4:].strip() for line in (docs / "api" / "norms.md").read_text().splitlines()
             if line.startswith("::: ")]
    assert order[:4] == ["bnlab.norms.create", "bnlab.norms.tools.convert.convert",
                         "bnlab.norms.tools.fold.fold", "bnlab.norms.track"]
    assert order.index("bnlab.norms.ChannelNorm") > order.index("bnlab.norms.BatchRenorm")
    probes = [line[4:].strip() for line in (docs / "api" / "probes.md").read_text().splitlines()
              if line.startswith("::: ")]
    assert probes[0] == "bnlab.probes.Lab" and probes.index("bnlab.probes.Probe") > len(probes) // 2
    spec = util.spec_from_file_location("docs_hooks", docs / "hooks.py")
    hooks = util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    html = 'see :func:<code>bnlab.norms.track</code> and :class:<code>Lab</code>'
    assert hooks.on_page_content(html) == "see <code>bnlab.norms.track</code> and <code>Lab</code>"
    assert hooks.on_page_markdown("use :func:`~bnlab.norms.fold`") == "use `bnlab.norms.fold`"


def test_free_cores_reads_the_cpus_busy_now_not_the_lagging_load_average(tmp_path, monkeypatch):
    """Two snapshots of /proc/stat 1 000 jiffies apart per CPU: one CPU of two busy the whole time
    -> 1 busy core; both idle -> 0 (the 1-minute load average would still say 0.7 after a job)."""
    from bnlab.experiments import parallel

    stat = tmp_path / "stat"
    snapshots = iter(["cpu 100 0 100 800 0 0 0 0\n", "cpu 1100 0 100 1800 0 0 0 0\n",
                      "cpu 100 0 100 800 0 0 0 0\n", "cpu 100 0 100 2800 0 0 0 0\n"])

    def sleep(_):
        stat.write_text(next(snapshots))

    monkeypatch.setattr(parallel.time, "sleep", sleep)
    monkeypatch.setattr(parallel.os, "cpu_count", lambda: 2)
    stat.write_text(next(snapshots))
    assert parallel.busy_cores(2, stat=str(stat)) == pytest.approx(1.0)
    stat.write_text(next(snapshots))
    assert parallel.busy_cores(2, stat=str(stat)) == pytest.approx(0.0)
    assert parallel.cpu_times(str(tmp_path / "missing")) is None
