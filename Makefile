# Two commands set everything up on a fresh machine: `make test` and `make demo`.
# `make demo` installs bnlab with the [lab] extra (CLI, training, theory, catalogue, report);
# `make test` adds the [test] extra (pytest, and what the suite exercises: Ray, trackers, timm, ...).
# `make docs` installs only the [docs] extra's packages (MkDocs) into the venv.
# torch is pinned to the local CPU wheel only when no torch is importable, so a user's own
# (e.g. CUDA) build is kept: if the system python already has torch, the venv sees it.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: test demo install bench clean docs

$(VENV)/.torch:
	@if [ ! -x $(PY) ]; then \
	  if $(PYTHON) -c "import torch" 2>/dev/null; then $(PYTHON) -m venv --system-site-packages $(VENV); \
	  else $(PYTHON) -m venv $(VENV); fi; fi
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "torch==2.13.0"
	@touch $@

$(VENV)/.lab: pyproject.toml $(VENV)/.torch
	$(PY) -m pip install -q -e ".[lab]"
	@touch $@

$(VENV)/.installed: pyproject.toml $(VENV)/.torch
	$(PY) -m pip install -q -e ".[lab,test]"
	@touch $@ $(VENV)/.lab

install: $(VENV)/.installed

# One pytest worker per core (pytest-xdist): the tests run with one torch thread each (conftest), so
# two workers on two cores take about half the time of one process. `pytest tests/x.py` stays serial.
test: $(VENV)/.installed
	$(PY) -m pytest -n auto --dist worksteal

demo: $(VENV)/.lab
	$(VENV)/bin/bnlab demo

# The docs need only the [docs] extra's packages (the API pages are read from the sources statically,
# nothing is imported): no torch, no test extra. The list is read from pyproject.toml.
DOCS_REQS = $(shell sed -n 's/^docs = \[\(.*\)\].*/\1/p' pyproject.toml | tr -d ',')

$(VENV)/.docs: pyproject.toml
	@[ -x $(PY) ] || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q $(DOCS_REQS)
	@touch $@

docs: $(VENV)/.docs
	$(PY) -m mkdocs build --strict

bench: $(VENV)/.installed
	$(PY) benchmarks/norms.py

clean:
	rm -rf $(VENV) build *.egg-info
