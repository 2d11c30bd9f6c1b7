# The two commands of the README: `make run` and `make test`.
# Both create .venv on first use and install the project with what it needs.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test bench clean gqa-llama

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

# Llama3-70B-shape GQA attention runs (timing mode, minutes each): not part of the tests
gqa-llama: $(STAMP)
	for f in scenarios/ahbm/gqa/llama70b_*.yaml; do $(BIN)/emu run $$f --no-bundle || exit 1; done

clean:
	rm -rf $(VENV) runs
