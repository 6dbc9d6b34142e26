# The two commands of the README.  Both create .venv and install what they need.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
export AIAYN_DATA ?= $(abspath ../shared/data)

.PHONY: setup setup-dev setup-bench setup-browser demo test test-fast lint typecheck docs fmt check-style check-types check-docs check-tests

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# Every dependency is declared once, in pyproject.toml (its extras); torch is pinned here to
# the CPU wheel, since a looser pin pulls a multi-GB CUDA build.
TORCH := torch==2.13.0

setup: $(BIN)/python
	$(BIN)/pip install -q "$(TORCH)" -e ".[app]"

setup-dev: $(BIN)/python
	$(BIN)/pip install -q "$(TORCH)" -e ".[dev]"

# The peers of benchmarks/ (CTranslate2, x-transformers, locust) besides the dev tools.
setup-bench: $(BIN)/python
	$(BIN)/pip install -q "$(TORCH)" -e ".[bench]"

# Debian's Chromium for the explorer's end-to-end test (tests/explore/test_browser.py skips
# without it, unless AIAYN_REQUIRE_BROWSER=1).  Playwright drives it; nothing is downloaded.
setup-browser:
	@command -v chromium >/dev/null || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium >/dev/null; }

demo: setup
	$(BIN)/aiayn demo

lint: setup-dev check-style check-types

typecheck: setup-dev check-types

# The tests without the end-to-end ones that take seconds each (@pytest.mark.slow: training,
# installing, serving over sockets, fuzzing): for the edit-test loop.  make test runs them all.
test-fast: setup-dev
	$(BIN)/python -m pytest -q -n logical --maxprocesses=4 -m "not slow"

# The documentation site (mkdocs.yml, docs/): --strict fails on a broken link or a missing page.
docs: setup-dev check-docs

# Everything CI checks: the two installs side by side, then the style, the types, the docs and
# pytest, one after the other (pytest takes both cores: running mypy beside it cost pytest more
# than it saved).
test:
	$(MAKE) --no-print-directory -j2 setup-dev setup-browser
	$(MAKE) --no-print-directory check-style check-types check-docs check-tests

# Format the code as CI checks it.
fmt: setup-dev
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# The parts, on an installed .venv.
check-style:
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

check-types:
	$(BIN)/mypy

check-docs:
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

check-tests:
	$(BIN)/python -m pytest -q -n logical --maxprocesses=4 --durations=25
