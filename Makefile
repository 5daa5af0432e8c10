# Each target sets itself up: a fresh machine needs only Python 3.10+ and `make`.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed-$(shell cat pyproject.toml Makefile | cksum | cut -d' ' -f1)
# torch is pinned: a bare `torch` (or an open range) pulls a multi-GB CUDA build on some machines.
TORCH   ?= torch==2.13.0
export HF_HUB_OFFLINE = 1
export HF_HUB_DISABLE_PROGRESS_BARS = 1
export TOKENIZERS_PARALLELISM = false

.PHONY: install quickstart test test-cluster test-fast docs docs-serve bench bench-trl lint clean

$(STAMP):
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[dev]"
	rm -f $(VENV)/.installed-* && touch $(STAMP)

install: $(STAMP)

## Runs the built-in SFT -> RM -> PPO pipeline on the tiny model and task; writes runs/quickstart/report.html
quickstart: $(STAMP)
	$(BIN)/rlhfkit quickstart --out runs/quickstart

## The test suite (unit, end-to-end on tiny models, CLI, 2-process DDP); the other several-process tests and the longest
## checks: test-cluster
test: $(STAMP)
	bash tools/system_deps.sh
	$(BIN)/python -m pytest -q -p no:cacheprovider

test-cluster: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider -m cluster tests/unit tests/e2e tests/cli

## The documentation site (docs/, Sphinx + MyST): built with every warning an error, then every code block run
docs: $(STAMP)
	$(BIN)/python -m pip install -q -e ".[docs]"
	$(BIN)/sphinx-build -W --keep-going -n -q -b html docs docs/_build/html
	$(BIN)/python -m pytest -q -p no:cacheprovider -m docs tests/docs

docs-serve: docs
	$(BIN)/python -m http.server -d docs/_build/html 8000

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/unit

bench: $(STAMP)
	$(BIN)/python bench/run_all.py

## rlhfkit against TRL 1.16 at equal settings (TRL lives only in .venv-trl, never a project dependency)
bench-trl:
	test -x .venv-trl/bin/python || $(PY) -m venv .venv-trl
	.venv-trl/bin/python -m pip install -q "$(TORCH)" && .venv-trl/bin/python -m pip install -q -e ".[gguf,tasks]" "trl==1.16.0" datasets
	.venv-trl/bin/python bench/vs_trl.py $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check src tests bench examples tools

clean:
	rm -rf runs .pytest_cache docs/_build
