"""The benchmark scripts run and write the documented keys (--quick dry runs; no timing is
asserted)."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def load(name):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True)
def fresh_dynamo():
    yield
    torch._dynamo.reset()


def test_gpu_benchmark_refuses_without_cuda(monkeypatch, capsys, tmp_path):
    gpu = load("gpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu.main(["--out-dir", str(tmp_path)]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
    # CPU only as a --quick dry run
    assert gpu.main(["--device", "cpu", "--out-dir", str(tmp_path)]) == 2
    assert "only a dry run" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
    with pytest.raises(SystemExit):
        gpu.main(["--device", "cpu", "--quick", "--specs", "nope"])


def test_gpu_benchmark_dry_run_writes_every_section(tmp_path):
    gpu = load("gpu")
    assert gpu.main(
        ["--device", "cpu", "--quick", "--specs", "bn", "--out-dir", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "gpu-cpu.json").read_text())
    assert {"device", "torch", "cuda", "layers", "resnet20_step", "elapsed_s",
            "budget_s"} <= set(result)
    layers = {(r["spec"], r["precision"], r["mode"]) for r in result["layers"]}
    assert layers == {("bn", p, "eager")
                      for p in ("fp32", "fp16", "bf16")} | {("bn", "fp32", "compiled")}
    resnet = {(r["spec"], r["precision"], r["mode"]) for r in result["resnet20_step"]}
    assert resnet == {("bn", "fp32", "eager"), ("bn", "bf16", "eager"), ("bn", "fp32", "compiled")}
    for row in result["layers"] + result["resnet20_step"]:
        assert {"ms", "ref_ms", "ratio", "reference"} <= set(row), row  # no error, nothing skipped
    agreement = {(r["spec"], r["precision"]): r for r in result["float64_agreement"]}
    assert set(agreement) == {("bn", p) for p in ("fp32", "fp16", "bf16")}
    assert agreement["bn", "bf16"]["y"]["rounded_once"]


def test_a_layer_failing_its_device_check_is_reported_not_fatal(monkeypatch):
    gpu = load("gpu")

    def broken(*args):
        raise RuntimeError("no kernel for this dtype\nsecond line")
    monkeypatch.setattr(gpu, "float64_agreement", broken)
    row = gpu.agreement_or_failure("mbn", (8, 4, 4, 4), torch.device("cpu"), "bf16")
    assert row == {"spec": "mbn", "precision": "bf16",
                   "error": "RuntimeError: no kernel for this dtype"}


@pytest.mark.parametrize("spec", ["cbn", "lp_bn(p=inf)"])
def test_float64_agreement_reports_a_half_step_rounded_once(spec):
    """The device check of benchmarks/gpu.py, on the CPU's fused path: half inputs within half an
    ulp of float64, float32 within a few eps of it."""
    timing = load("timing")
    for precision in ("bf16", "fp16"):
        row = timing.float64_agreement(spec, (32, 64, 16, 16), "cpu", precision)
        assert row["path"] in ("_StatsAffineBackward", "_LpNormalizeBackward"), row
        assert row["y"]["rounded_once"] and row["input_grad"]["rounded_once"], row
        assert row["y"]["error"] < 1 and row["input_grad"]["error"] < 1, row
    full = timing.float64_agreement(spec, (32, 64, 16, 16), "cpu", "fp32")
    assert "rounded_once" not in full["y"] and full["y"]["error"] < 100, full


def test_norms_benchmark_quick_writes_eager_and_compiled_columns(tmp_path):
    norms = load("norms")
    out = tmp_path / "norms.json"
    specs = ("native_bn", "bn", "si_bn", "mean_only_bn")
    result = norms.main(["--quick", "--threads", "1", "--specs", ",".join(specs), "--out",
                         str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    assert {(r["spec"], r["mode"]) for r in result["rows"]} == {
        (s, m) for s in specs for m in ("eager", "compiled", "compiled_step")}
    # mean_only_bn and si_bn take bnlab.norms.compiled_steps(); the others say they do not
    timed = [r for r in result["rows"] if r["mode"] != "compiled_step"
             or r["spec"] in ("mean_only_bn", "si_bn")]
    assert all(r["ratio"] > 0 and r["ms"] > 0 for r in timed)
    assert all("does not take" in r["skipped"] for r in result["rows"] if r not in timed)
    assert "| compiled step × |" in norms.side_by_side(result["rows"])
    si = next(r for r in result["rows"] if r["spec"] == "si_bn")
    # wrappers are compared with their conv + BN
    assert si["reference"].startswith("conv1x1+native_bn")
    goals = result["goals"]
    assert set(goals) == {"eager_bn_family_le_1.3", "compiled_every_layer_le_1.0",
                          "eager_others_le_1.5"}
    # mbn, cbn, ... were not run: cannot be met
    assert goals["eager_bn_family_le_1.3"]["met"] is False


def test_eager_floor_quick_times_the_floor_of_the_same_computation(tmp_path):
    """benchmarks/eager_floor.py: every candidate on both small shapes against nn.BatchNorm, and its
    hand-written and compiled mean-only functions compute what bnlab's mean_only_bn does (output,
    gradients)."""
    floor = load("eager_floor")
    out = tmp_path / "floor.json"
    result = floor.main(["--quick", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    assert result["lean_mean_only_agrees_with_bnlab"] is True
    assert result["compiled_mean_only_agrees_with_bnlab"] is True
    assert result["aot_step_agrees_with_bnlab"] is True
    assert {(tuple(r["shape"]), r["layer"]) for r in result["rows"]} == {
        (s, name) for s in floor.SHAPES
        for name in ("empty_function", "lean_mean_only", "compiled_mean_only",
                     "aot_function mean_only_bn", "bnlab bn", "bnlab mean_only_bn")}
    assert all(r["ratio"] > 0 and r["ms"] > 0 for r in result["rows"])


def test_eager_floor_check_catches_a_wrong_floor(monkeypatch):
    """The agreement check can fail: a lean function that forgets the mean's gradient disagrees."""
    floor = load("eager_floor")
    backward = floor._LeanMeanOnly.backward

    def wrong(ctx, g):
        g_x, g_w, g_b = backward(ctx, g)
        return g * ctx.saved_tensors[2].view(1, -1, *([1] * (g.dim() - 2))), g_w, g_b

    monkeypatch.setattr(floor._LeanMeanOnly, "backward", staticmethod(wrong))
    assert floor.agrees_with_bnlab((100, 10)) is False


def test_a_later_process_loads_the_compiled_step_from_inductors_cache(tmp_path):
    """bnlab/norms/engine/compiled_step.py ``_compile``: a compiled step goes into inductor's
    on-disk FX graph cache and a later process loads it instead of compiling again (without a
    tracing context holding a shape environment inductor bypassed that cache: "No shape env"). Runs
    ``benchmarks/compile_stall.py``'s child process, which that benchmark times by hand."""
    first_calls = load("compile_stall").first_calls
    first, second = (first_calls("mean_only_bn", str(tmp_path)) for _ in range(2))
    # both processes ran the compiled forward and backward, not the eager step
    assert first["compiled_calls"] == second["compiled_calls"] == {"forward": 1, "backward": 1}
    assert first["fx_graph_cache"] == {"fxgraph_cache_miss": 2}  # compiled, then stored
    assert second["fx_graph_cache"] == {"fxgraph_cache_hit": 2}  # loaded, not compiled
    # the loaded code computes what the freshly compiled code did, bit for bit
    assert first["digest"] == second["digest"]


def test_the_reading_path_on_writing_a_variant_is_the_one_that_runs_today():
    """The files-and-lines table of docs/readme/writing-a-variant.md and norms_reading.json's
    "now" are what `benchmarks/norms_reading.py` measures on the code as it is: a module moved or
    grown changes them, and this fails until both are regenerated."""
    import re

    reading = load("norms_reading")
    page = (BENCHMARKS.parent / "docs" / "readme" / "writing-a-variant.md").read_text()
    recorded = json.loads((BENCHMARKS / "results" / "norms_reading.json").read_text())["now"]
    for spec, shape, route in reading.STEPS:
        now = reading.measure(spec, shape)
        size = "×".join(map(str, shape))
        row = re.search(rf"^\| `{spec}`, {route} \({size}\) \| (\d+)[:|].*\| ([\d,]+) \|$", page,
                        re.M)
        assert row, f"no row for {spec} {route} {size}"
        redo = ("run `python benchmarks/norms_reading.py --record` and copy its numbers into "
                "the page's table")
        on_page = int(row[1]), int(row[2].replace(",", ""))
        assert on_page == (len(now["files"]), now["lines"]), redo
        assert recorded[reading.step_name(spec, shape, route)] == now, redo
