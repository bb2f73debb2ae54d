"""`bnlab doctor [bnlab train's flags]` and `bnlab train --doctor`, through typer's CLI runner (as
the other CLI tests): the report printed one line per finding, most severe first; --json and
--html files; the train command's flags, not a copy of them; configuration errors exit 2."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from bnlab.cli import app
from bnlab.cli.doctor import DOCTOR_OPTIONS
from bnlab.cli.train import TRAIN_OPTIONS
from bnlab.doctor import CODES

runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, list(args))


def test_doctor_trains_steps_and_prints_and_writes_the_report(tmp_path):
    out_json, out_html = tmp_path / "report.json", tmp_path / "report.html"
    result = invoke("doctor", "--model", "mlp", "--data", "digits", "--steps", "24",
                    "--batch-size", "4", "--every", "8", "--json", str(out_json),
                    "--html", str(out_html))
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith("run ") and "finished after 24 steps" in lines[0]
    assert "read one in 8" in lines[0]
    report = json.loads(out_json.read_text())
    findings = report["findings"]
    # one line per finding, in the report's order (warn first), each naming its code
    printed = [line for line in lines[1:] if line.startswith(("WARN", "INFO"))]
    assert [line.split()[1].rstrip(":") for line in printed] == [f["code"] for f in findings]
    severities = [f["severity"] for f in findings]
    assert severities == sorted(severities, key=["warn", "info"].index)
    # a batch of 4 is a small batch for BN (Yong et al.'s noise at m = 4)
    assert "small-batch" in [f["code"] for f in findings if f["severity"] == "warn"]
    assert {f["code"] for f in findings} <= set(CODES)
    assert report["context"]["steps"] == 24 and report["context"]["batch_size"] == 4
    assert out_html.read_text().startswith("<!DOCTYPE html>")
    assert not (tmp_path / "runs").exists()  # a temporary store unless --runs-dir


def test_doctor_takes_every_flag_of_train():
    # the same option objects, generated once from TrainConfig's fields (bnlab.cli.train)
    shared = {name for name in TRAIN_OPTIONS if name not in ("as_json", "doctor")}
    assert all(DOCTOR_OPTIONS[name] is TRAIN_OPTIONS[name] for name in shared)
    assert set(DOCTOR_OPTIONS) - shared == {"json_file", "html_file", "every"}
    help_text = invoke("doctor", "--help").output
    for flag in ("--model", "--batch-size", "--lr", "--steps", "--html", "--every"):
        assert flag in help_text, flag


def test_train_doctor_prints_the_report_after_the_run(tmp_path):
    args = ("train", "--model", "mlp", "--data", "digits", "--steps", "16", "--doctor",
            "--runs-dir", str(tmp_path))
    first = invoke(*args)
    assert first.exit_code == 0, first.output
    assert "doctor (16 steps watched):" in first.output
    again = invoke(*args)  # stored already: nothing trained, nothing to report
    assert again.exit_code == 0 and "no step was trained" in again.output
    as_json = invoke(*args, "--force", "--json")
    record = json.loads(as_json.output.strip().splitlines()[-1])
    assert record["status"] == "finished" and {"findings", "measurements", "context"} <= set(
        record["doctor"])


def test_configuration_errors_exit_2_with_one_line():
    bad_lr = invoke("doctor", "--model", "mlp", "--steps", "4", "--lr", "-1")
    assert bad_lr.exit_code == 2 and "lr must be positive" in bad_lr.output
    several = invoke("doctor", "--model", "mlp", "--steps", "4", "--nproc", "2")
    assert several.exit_code == 2 and "the doctor watches one process" in several.output
