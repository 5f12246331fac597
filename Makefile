# One command for the tests: `make test` makes .venv, installs the pinned CPU torch when no torch
# is importable there (an unpinned torch would pull a multi-GB CUDA build), then folnet with its
# extras, then runs the suite -- and the tests marked `numerics` a second time under another CPU
# kernel set (docs/design.md section 9), so that a bound that holds only for this machine's
# arithmetic fails here first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_PIN ?= torch==2.13.0
# Two test processes (pytest-xdist), whole files each, longest first (tests/conftest.py).
JOBS ?= 2
PYTEST := $(PY) -m pytest -q -n $(JOBS) --dist loadfile --no-loadscope-reorder
# The second kernel set: torch's non-vectorised ATen kernels, oneDNN held to SSE4.1.
OTHER_KERNELS := ATEN_CPU_CAPABILITY=default ONEDNN_MAX_CPU_ISA=SSE41

.PHONY: test test-slow test-all test-cluster test-numerics test-torch tolerances demo demo-operators demo-kinds lint setup clean \
	kinship-fixture docs conformance

setup: $(VENV)/.installed

# Installs go through uv when it installs (torch 15 s here, against 31 s for pip); pip is the
# fallback. uv is asked for the CPU build by its local version ($(TORCH_PIN)+cpu, from pip's
# find-links where set), so it can never resolve to a CUDA build; the extras keep the torch
# already there. --compile-bytecode, and compileall for folnet itself: where
# PYTHONDONTWRITEBYTECODE is set (here it is) nothing else writes .pyc files, and every test
# process would compile torch's and transformers' sources again (importing torch: 16 s
# instead of 2).
$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q uv || true
	$(PY) -c "import torch" 2>/dev/null \
		|| $(PY) -m uv pip install -q --compile-bytecode --python $(PY) $${PIP_FIND_LINKS:+--find-links $$PIP_FIND_LINKS} '$(TORCH_PIN)+cpu' \
		|| $(PY) -m pip install -q $(TORCH_PIN)
	$(PY) -m uv pip install -q --compile-bytecode --python $(PY) -e '.[train,hf,dev]' \
		|| $(PY) -m pip install -q -e '.[train,hf,dev]'
	$(PY) -m compileall -q folnet tests benchmarks
	touch $@

# The gate CI runs (.ci/run): the strict site build, every test but those marked slow or
# cluster, then the numerical ones again under the other kernel set -- under 10 minutes on 2
# cores from a clean clone. It names its 15 slowest tests, so that its log says where the time
# went when it nears that.
test: setup
	$(DOCS_BUILD) --strict
	$(PYTEST) --durations=15 -m "not slow and not cluster"
	$(MAKE) --no-print-directory test-numerics

# The numerical tests under the other kernel set (those also marked slow -- torchrun, export,
# the bf16 curve, inductor -- are left to `make tolerances`, which measures every bound on both).
test-numerics: setup
	$(OTHER_KERNELS) $(PYTEST) -m "numerics and not slow and not cluster"

# The tests marked slow, which make test leaves out: end-to-end runs of a minute or more
# (training to a result, ablations, torchrun, compile and export; about 11 minutes on 2 cores).
# Run it before a change to training, the ablation runner or the kernels lands.
test-slow: setup
	$(PYTEST) --durations=15 -m "slow and not cluster"

# Everything: make test, make test-slow, make test-cluster.
test-all: test test-slow test-cluster

# The tests marked cluster, which make test leaves out (root needed: ip netns, apt-get):
# torchrun across two test hosts -- network namespaces joined by a veth pair
# (tests/hosts.py, tests/train/test_multinode.py, about 3 minutes) -- and `folnet ablate
# --executor slurm|local` on a real one-node SLURM the tests start in a temporary folder
# (tests/slurm_cluster.py; slurm-wlm and munge installed with apt-get when slurmctld is
# absent), with submitit (the cluster extra; about 5 minutes). One process: the hosts and
# the SLURM share this machine's cores.
test-cluster: setup
	$(PY) -c "import submitit" 2>/dev/null \
		|| $(PY) -m uv pip install -q --python $(PY) -e '.[train,hf,dev,cluster]' \
		|| $(PY) -m pip install -q -e '.[train,hf,dev,cluster]'
	$(PY) -m pytest -q -s -m cluster --durations=10 tests/train/test_multinode.py \
		tests/train/test_ablate_slurm.py

# The suite but the slow tests, and the installed wheel's test, on another torch in its own
# environment: `make test-torch TORCH=2.11.0` (the floor pyproject.toml declares; README "Which
# torch"); PINS adds other pins, e.g. PINS=transformers==5.17.0 for the GPU images' pair. The
# registry's torch wheels are CUDA builds that run on a CPU too (about 3 GB; pip caches them).
# make test itself stays on $(TORCH_PIN).
TORCH ?= 2.11.0
PINS ?=
TORCH_VENV := .venv-torch-$(TORCH)
test-torch:
	test -x $(TORCH_VENV)/bin/python || $(PYTHON) -m venv $(TORCH_VENV)
	$(TORCH_VENV)/bin/python -c "import torch; assert torch.__version__.split('+')[0] == '$(TORCH)'" \
		2>/dev/null || $(TORCH_VENV)/bin/python -m pip install -q "torch==$(TORCH)"
	$(TORCH_VENV)/bin/python -m pip install -q -e '.[train,hf,dev]' "torch==$(TORCH)" $(PINS)
	$(TORCH_VENV)/bin/python -m pytest -q -n $(JOBS) --dist loadfile --no-loadscope-reorder -m "not slow"
	$(TORCH_VENV)/bin/python -m pytest -q tests/project/test_installed.py

# transformers' own model and configuration tests (ModelTesterMixin, ConfigTester from its
# source distribution at the installed version, fetched by pip and cached under
# build/conformance) on folnet's HF classes, BERT and GPT-2 run beside them as the controls
# (tests/conformance/run.py). Fails on a test the controls pass and folnet fails unless
# tests/conformance/refused.toml lists it with the reason. About 3 minutes on 2 cores.
conformance: setup
	$(PY) -c "import parameterized" 2>/dev/null || $(PY) -m uv pip install -q --python $(PY) parameterized \
		|| $(PY) -m pip install -q parameterized
	$(PY) tests/conformance/run.py --out build/conformance --report docs/figures/conformance.json

# Every numerical bound against what the two kernel sets measure (tests/tolerance_report.py),
# the GPU tests' included: rehearsed on the CPU (FOLNET_GPU_REHEARSAL=1), as gpu_check.py's dry
# run does, so that their bf16 bounds are measured on both kernel sets like every other.
tolerances: setup
	rm -f .tolerances-*.jsonl
	FOLNET_GPU_REHEARSAL=1 FOLNET_TOLERANCE_LOG=$(CURDIR)/.tolerances-native.jsonl $(PYTEST) \
		-m numerics
	FOLNET_GPU_REHEARSAL=1 FOLNET_TOLERANCE_LOG=$(CURDIR)/.tolerances-default.jsonl \
		$(OTHER_KERNELS) $(PYTEST) -m numerics
	$(PY) tests/tolerance_report.py .tolerances-native.jsonl .tolerances-default.jsonl \
		--json docs/figures/tolerances.json

# The main job: what pretraining with the operators buys, on the embedded symbolic kinship
# corpus (no files needed): j.a and jmc.atp, pretrained against scratch, 5 seeds
# (folnet/specs/ablations/pretraining.toml, under 10 minutes on 2 cores).
demo: setup
	$(PY) -m folnet ablate pretraining --jobs 2 --out runs/demo

# Its second part: the six-row operator ablation (folnet/specs/ablations/demo.toml, about 9 minutes).
demo-operators: setup
	$(PY) -m folnet ablate demo --jobs 2 --out runs/demo-operators

# The main job asked of the generative kinds: j.a and jmc.atp as decoders and encoder-decoders,
# pretrained, then finetuned to answer the symbolic kinship questions by generation
# (folnet/specs/ablations/kinds.toml).
demo-kinds: setup
	$(PY) -m folnet ablate kinds --jobs 2 --out runs/demo-kinds

# The stored start of tests/train/test_kinship_finetune.py: the shipped kinship-tiny pretraining
# (800 steps, ~13 minutes on 2 cores: docs/figures/kinship_recipe.json), its model directory and
# its run_config.json as recipe.json.
kinship-fixture: setup
	rm -rf .kinship-fixture tests/fixtures/kinship-pretrained
	$(PY) -m folnet pretrain --config kinship-tiny --no-progress --out .kinship-fixture
	cp -r .kinship-fixture/final tests/fixtures/kinship-pretrained
	cp .kinship-fixture/run_config.json tests/fixtures/kinship-pretrained/recipe.json
	rm -rf .kinship-fixture

# The documentation site (mkdocs.yml, docs/design.md section 13) into build/site/, which opens
# from disk: build/site/index.html. `make test` runs the same build with --strict first.
# (never --quiet: it hides the warnings that --strict counts, and a broken link would pass)
# `make docs PY=python3` builds with a Python you already have and installs nothing: no .venv,
# no editable folnet in place of yours. The build reads this checkout's folnet (mkdocs.yml's
# paths: [.]), so that Python needs only folnet's dependencies with the train and hf extras, and
# mkdocs>=1.6, mkdocs-material>=9.6, mkdocstrings-python>=1.16 (README "Documentation").
DOCS_BUILD = NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build
DOCS_SETUP := $(if $(filter command line,$(origin PY)),,setup)
docs: $(DOCS_SETUP)
	$(DOCS_BUILD) --strict
	@echo "open build/site/index.html"

lint: setup
	$(PY) -m ruff check folnet tests benchmarks

clean:
	rm -rf $(VENV) .venv-torch-* build dist *.egg-info
