# Every target is self-contained on a fresh machine: it creates .venv and installs what it needs.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
TORCH   := torch==2.13.0
EXTRAS  ?= dev,alfworld,sql,bfcl,serve,openai,code,ray,openenv
BFCL    := bfcl-eval==2025.6.8
comma   := ,
STAMP   := $(VENV)/.installed-$(subst $(comma),-,$(EXTRAS))

.PHONY: install demo test test-all lint clean

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

demo: $(STAMP)
	$(BIN)/turnforge quickstart --out runs/quickstart

test: $(STAMP)
	$(BIN)/python -m pytest -q

test-all: $(STAMP)
	$(BIN)/python -m pytest -q -m ""

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache
