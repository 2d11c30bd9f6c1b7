# The two commands of the README: `make run` and `make test`.
# Both create .venv on first use and install the project with what it needs.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test bench clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test,bench,ray]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/emu run scenarios/demo/reduce.yaml

test: $(STAMP)
	$(BIN)/python -m pytest

bench: $(STAMP)
	$(BIN)/emu bench engine

clean:
	rm -rf $(VENV) runs
