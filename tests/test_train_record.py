"""RunRecord.to_dict: a deep copy by default (what ``dataclasses.asdict`` gives), the record's own
nested values with ``copy=False`` (the catalogue's view of a record just read from the store)."""

import dataclasses

from bnlab.train import RunRecord


def _record() -> RunRecord:
    row = {"id": "abc123", "status": "finished", "steps": 4, "error": None,
           "config": {"model": "mlp", "lr": 0.1, "model_options": {"width": 8}},
           "env": {"torch": "2.13.0"},
           "summary": {"metrics": {"test_accuracy": 0.9}, "scale_invariant": {"w": 1}}}
    return RunRecord.from_store(row)


def test_to_dict_copies_unless_asked_not_to_and_both_forms_agree():
    record = _record()
    deep, shallow = record.to_dict(), record.to_dict(copy=False)
    assert deep == shallow == dataclasses.asdict(record)
    assert list(deep) == [f.name for f in dataclasses.fields(RunRecord)]
    deep["config"]["model_options"]["width"] = 99
    assert record.config["model_options"]["width"] == 8
    assert shallow["config"] is record.config and shallow["env"] is record.env
