# The two commands of the README: `make run` and `make test`.
# Both create .venv on first use and install the project with what it needs.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test bench clean gemma3n-e4b

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test,bench]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/emu run scenarios/demo/reduce.yaml

test: $(STAMP)
	$(BIN)/python -m pytest

bench: $(STAMP)
	$(BIN)/emu bench engine

# Gemma 3N E4B decode on pccx (docs/pccx-gemma3n.md): one token per scenario, minutes each
gemma3n-e4b: $(STAMP)
	for s in scenarios/pccx/gemma3n/e4b-*.yaml; do $(BIN)/emu run $$s --no-bundle || exit 1; done

clean:
	rm -rf $(VENV) runs
