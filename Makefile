# Every target works from a fresh clone on a machine that has only Python 3.10+.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
BENCH_STAMP := $(VENV)/.installed-bench
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)

.PHONY: install test test-fast lint build bench run clean

install: $(STAMP)

# The server depends on delaywheel-client, which lives in client/: naming both
# in one command makes pip take it from there instead of asking an index.
$(STAMP): pyproject.toml client/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ./client -e '.[test]'
	touch $(STAMP)

# Two passes: everything but the `serial` tests on $(JOBS) workers, a file to a
# worker (most tests wait on processes and timers, not the CPU), then the
# `serial` ones alone (they assert timings, leases or latencies, that a busy
# machine would break). MARK narrows both by marker: make test MARK='not slow'.
# Exit status 5 is pytest's "no test selected" (PYTEST_ARGS naming a file).
JOBS ?= 2
MARK ?=
test: install
	$(BIN)/python -m pytest -n $(JOBS) --dist loadfile -m "not serial$(if $(MARK), and ($(MARK)))" $(PYTEST_ARGS)
	$(BIN)/python -m pytest -m "serial$(if $(MARK), and ($(MARK)))" $(PYTEST_ARGS) || [ $$? -eq 5 ]

# The unit tests alone, in under a minute: none that starts a process of ours,
# needs a redis-server, a broker or a build, or takes seconds (tests/README.md).
FAST_MARKERS := not (slow or process or redis or brokers or packaging or browser)
test-fast: install
	$(BIN)/python -m pytest -m "$(FAST_MARKERS)" $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check .
	$(BIN)/mypy

# Two distributions, an sdist and a wheel each: delaywheel-client (the client
# library and Worker, msgpack alone) and delaywheel (the server and CLI, which
# depends on it). Then the image, when a Docker engine answers: a docker command
# without an engine (as on our CI machines) skips that step, saying so.
# A stale *.egg-info/SOURCES.txt is read back into the next sdist: start clean.
build: install
	rm -rf dist build *.egg-info client/build client/*.egg-info
	$(BIN)/python -m build --outdir dist client
	$(BIN)/python -m build --outdir dist .
	@if docker info >/dev/null 2>&1; then \
		docker build --tag delaywheel:$(VERSION) --tag delaywheel:latest . ; \
	else \
		echo "no Docker engine answers (docker info failed): image not built"; \
	fi

# The bench also needs the `bench` extra (greenstalk, the beanstalkd client).
$(BENCH_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -e ./client -e '.[test,bench]'
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(BIN)/python -m bench

run: install
	$(BIN)/delaywheel serve --store sqlite:///delaywheel.db

clean:
	rm -rf $(VENV) dist build *.egg-info client/build client/*.egg-info .pytest_cache .mypy_cache .ruff_cache \
		clients/node/node_modules clients/node/dist
