# Two commands set up everything on a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast test-latest acceptance lint install clean chromium gpu-check chaos bench

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first and alone: this exact version is a local CPU wheel; any other request pulls a CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	# DeepSpeed from source with its CPU comm op built now, against this torch, and no other op (no CUDA here): a
	# DeepSpeed run on CPU would otherwise compile it at its start. No cache: a cached wheel may lack the op.
	$(BIN)/pip install -q ninja
	DS_BUILD_OPS=0 DS_BUILD_SHM_COMM=1 DS_ACCELERATOR=cpu $(BIN)/pip install -q --no-cache-dir --no-build-isolation \
		'deepspeed>=0.17,<0.20'
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# The tiny model is built offline (no hub here); the flow then runs the seven steps on the embedded defaults:
# Prefect's ephemeral API and MLflow in ./mlflow.db.
demo: $(STAMP)
	test -f demo_output/tiny-llama/config.json || $(BIN)/tuneline tiny-model demo_output/tiny-llama --preset demo
	PREFECT_SERVER_ANALYTICS_ENABLED=false $(BIN)/tuneline train examples/sft_lora_demo.yaml
	@echo "See the run: $(BIN)/mlflow ui --backend-store-uri sqlite:///mlflow.db --host 127.0.0.1"

lint: $(STAMP)
	$(BIN)/ruff check tuneline tasks flows cli orchestration tests benchmarks deployments
	$(BIN)/lint-imports

# The browser tests drive the system's Chromium; the set-up installs Debian's where it can (root and apt-get).
chromium:
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || \
		{ [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
		  { apt-get install -y -q --no-install-recommends chromium >/dev/null 2>&1 || \
		    { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends chromium >/dev/null; }; }; } || \
		echo "no Chromium (install the 'chromium' package): the browser tests will not run"

# The tests in tiers, by folder (tests/conftest.py marks each test with its tier): tests/unit (no process, server
# or training), tests/integration (trainings in process on tiny models), tests/e2e (flows, servers, chaos, browser),
# tests/acceptance. Each run records what each test cost in tests/durations.json.
# Test processes (pytest-xdist): one per core, at least 2 (most tests wait on a subprocess or a server), at most 4
# (they share one Prefect API and the tiny models, built once per run). worksteal: a flow test takes minutes, most
# others a second, so an idle worker takes queued tests from a busy one. TEST_WORKERS=0 runs them in one process.
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); echo $$(( n < 2 ? 2 : n > 4 ? 4 : n )))
PYTEST = PREFECT_SERVER_ANALYTICS_ENABLED=false $(1)/python -m pytest -q -n $(TEST_WORKERS) --dist worksteal \
	--durations=15
NO_BROWSER = $(if $(shell command -v chromium || command -v chromium-browser),,-m "not browser")
test: $(STAMP) lint chromium
	$(call PYTEST,$(BIN)) $(NO_BROWSER) tests/unit tests/integration tests/e2e

# The unit tier alone, for feedback while editing: it fails when the tier takes over two minutes.
test-fast: $(STAMP)
	$(call PYTEST,$(BIN)) tests/unit

# LLaMA-Factory's own example configs on its demo data, unchanged (tests/fixtures/llamafactory): minutes of
# training on the CPU, so kept out of `make test`; CI runs both.
acceptance: $(STAMP)
	$(call PYTEST,$(BIN)) tests/acceptance

# The newest releases our bounds admit (transformers, trl, prefect, mlflow, peft, ...), in their own environment
# (.venv-latest; the project's .venv stays as it is), then the unit and integration tiers on them. torch stays the
# CPU wheel (any other request pulls a CUDA build); DeepSpeed is built as `make install` builds it.
LATEST := .venv-latest
$(LATEST)/.installed:
	$(PY) -m venv $(LATEST)
	$(LATEST)/bin/pip install -q --upgrade pip
	$(LATEST)/bin/pip install -q torch==2.13.0 ninja setuptools wheel
	echo torch==2.13.0 > $(LATEST)/torch-pin.txt
	touch $@

test-latest: $(LATEST)/.installed
	DS_BUILD_OPS=0 DS_BUILD_SHM_COMM=1 DS_ACCELERATOR=cpu $(LATEST)/bin/pip install -q --no-cache-dir \
		--no-build-isolation --upgrade -c $(LATEST)/torch-pin.txt 'deepspeed>=0.17,<0.20'
	$(LATEST)/bin/pip install -q --upgrade --upgrade-strategy eager -c $(LATEST)/torch-pin.txt -e '.[dev]'
	$(LATEST)/bin/pip list 2>/dev/null | grep -iE '^(transformers|trl|prefect|mlflow|peft|accelerate|datasets|deepspeed) '
	$(call PYTEST,$(LATEST)/bin) tests/unit tests/integration

# On a CUDA machine: a ~0.5B Llama built offline, trained through `tuneline train` by each case (sft LoRA and full,
# ZeRO-3, dpo, grpo, Qwen3-VL on images and videos, Liger, fp8), then the same YAMLs through LLaMA-Factory; one table
# (benchmarks/gpu_check.py). A machine with no package index gets the wheels of `benchmarks/gpu_wheelhouse.py`:
# $(WHEELHOUSE)/tuneline and/or $(WHEELHOUSE)-llamafactory/llamafactory, installed offline into $(GPU_SITE) on top of
# its torch and transformers (DeepSpeed, an sdist, built there with no op). Without a wheelhouse, .venv runs it.
# GPU_CHECK_ARGS passes options (--dry-run, --device cpu, --preset, --cases, --steps, --systems, --time-budget).
WHEELHOUSE ?= .whl
GPU_SITE ?= /tmp/tuneline-gpu-site
gpu-check:
	@if [ -d $(WHEELHOUSE)/tuneline ] || [ -d $(WHEELHOUSE)-llamafactory/llamafactory ]; then \
		for load in $(WHEELHOUSE)/tuneline $(WHEELHOUSE)-llamafactory/llamafactory; do \
			[ ! -d $$load ] || DS_BUILD_OPS=0 $(PY) -m pip install -q --no-index --no-deps --no-build-isolation \
				--no-compile --upgrade --target $(GPU_SITE)/$$(basename $$load) $$load/* || exit 1; \
		done; \
		PYTHONPATH=$(CURDIR):$(GPU_SITE)/tuneline PREFECT_SERVER_ANALYTICS_ENABLED=false $(PY) benchmarks/gpu_check.py \
			$$([ -d $(GPU_SITE)/llamafactory ] && echo --llamafactory-site $(GPU_SITE)/llamafactory) $(GPU_CHECK_ARGS); \
	else \
		$(MAKE) -s install && PREFECT_SERVER_ANALYTICS_ENABLED=false $(BIN)/python benchmarks/gpu_check.py $(GPU_CHECK_ARGS); \
	fi

# Fault suite: real flow processes killed (SIGKILL of the process group) at five points, a truncated checkpoint and
# dataset cache entry, a full disk (a small tmpfs: needs root) during a checkpoint save; each rerun must finish
# equal to an uninterrupted run; the MLflow or Prefect server killed mid-train. Table; CHAOS_ARGS: --cases, --workdir.
chaos: $(STAMP)
	PREFECT_SERVER_ANALYTICS_ENABLED=false $(BIN)/python benchmarks/chaos.py $(CHAOS_ARGS)

# LLaMA-Factory 0.9.5 in its own environment (its pins clash with ours), for `make bench`: torch pinned (pip would
# swap the CPU wheel for a CUDA build), PyPI's torchvision removed (a CUDA build that fails beside a CPU torch),
# torchaudio's native libraries removed (LLaMA-Factory imports the package always, never its ops).
PEER := .venv-peer
$(PEER)/.installed:
	$(PY) -m venv $(PEER)
	$(PEER)/bin/pip install -q torch==2.13.0
	echo torch==2.13.0 > $(PEER)/torch-pin.txt
	$(PEER)/bin/pip install -q llamafactory==0.9.5 -c $(PEER)/torch-pin.txt
	$(PEER)/bin/pip uninstall -y -q torchvision
	find $(PEER)/lib -path '*/site-packages/torchaudio/*' -name '*.so*' -delete
	$(PEER)/bin/llamafactory-cli version >/dev/null
	touch $@

# tuneline against LLaMA-Factory, the same YAML through both, pair by pair (benchmarks/bench.py says what is
# measured); writes benchmarks/results/latest.md and latest.json. BENCH_ARGS passes options (--pairs, --repeats).
bench: $(STAMP) $(PEER)/.installed
	PREFECT_SERVER_ANALYTICS_ENABLED=false $(BIN)/python benchmarks/bench.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) $(PEER) $(LATEST) .tuneline demo_output mlflow.db mlruns
