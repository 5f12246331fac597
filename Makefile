# One command for the tests: `make test` makes .venv, installs the pinned CPU torch when no torch
# is importable there (an unpinned torch would pull a multi-GB CUDA build), then folnet with its
# extras, then runs the suite.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_PIN ?= torch==2.13.0

.PHONY: test demo lint setup clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q $(TORCH_PIN)
	$(PY) -m pip install -q -e '.[train,hf,dev]'
	touch $@

test: setup
	$(PY) -m pytest -q

# The main job: the operator-ablation demo on the embedded kinship corpus (no files needed).
demo: setup
	$(PY) -m folnet ablate demo --jobs 2 --out runs/demo

lint: setup
	$(PY) -m ruff check folnet tests benchmarks

clean:
	rm -rf $(VENV) build *.egg-info
