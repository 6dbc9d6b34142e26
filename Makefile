# The two commands of the README.  Both create .venv and install what they need.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
export AIAYN_DATA ?= $(abspath ../shared/data)

.PHONY: setup setup-dev demo test lint

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

setup: $(BIN)/python
	$(BIN)/pip install -q -r requirements.txt
	$(BIN)/pip install -q --no-deps -e .

setup-dev: $(BIN)/python
	$(BIN)/pip install -q -r requirements-dev.txt
	$(BIN)/pip install -q --no-deps -e .

demo: setup
	$(BIN)/aiayn demo

lint: setup-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

test: lint
	$(BIN)/python -m pytest -q
