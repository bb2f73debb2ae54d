"""Probe options inside a training config: `probes: ["grad_stats(k=2, every=3)"]`."""

from __future__ import annotations

import pytest

from bnlab.train import run
from bnlab.train.loop import parse_probe_spec


def test_parse_probe_spec_values():
    assert parse_probe_spec("ics") == ("ics", {})
    assert parse_probe_spec("landscape(num=4, multipliers=(0.5, 1, 2), method='naive', "
                            "verify=false)") == (
        "landscape", {"num": 4, "multipliers": (0.5, 1, 2), "method": "naive", "verify": False})
    with pytest.raises(ValueError, match="key=value"):
        parse_probe_spec("ics(5)")


def test_probe_options_and_cadence_reach_the_probe(tmp_path):
    record = run(dict(model="mlp", model_options={"depth": 2, "width": 8}, data="digits", steps=7,
                      batch_size=32, lr=0.05, probes=["grad_stats(k=2, every=3)"], probe_every=1,
                      runs_dir=str(tmp_path)),
                 progress=False)
    assert record.status == "finished"
    from bnlab.store import Store

    with Store(tmp_path / "bnlab.db") as store:
        series = store.metrics(record.id)
    probe_names = [n for n in series if n.startswith("probe/grad_stats/")
                   and not n.endswith("seconds")]
    assert probe_names
    assert {s for s, _ in series[probe_names[0]]} == {3, 6}  # every=3 overrides probe_every=1
    with pytest.raises(ValueError, match="valid options"):
        run(dict(model="mlp", data="digits", steps=2, probes=["grad_stats(bogus=1)"],
                 runs_dir=str(tmp_path)),
            progress=False)
