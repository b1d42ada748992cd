# The two set-up commands of README.md: `make demo` and `make test`. Each builds what it needs.
SHELL := /bin/bash
# Interpreters installed through pyenv are put on PATH so tox finds python3.11 and python3.13.
PYENV_BINS := $(wildcard $(HOME)/.pyenv/versions/3.11*/bin $(HOME)/.pyenv/versions/3.12*/bin $(HOME)/.pyenv/versions/3.13*/bin)
export PATH := $(subst $(eval) ,:,$(PYENV_BINS)):$(PATH)
PYTHON ?= python3.11
VENV := .venv
TOX := $(VENV)/bin/tox
TEST_ENVS ?= lint,docs,py311-dj52-sqlite,py311-dj52-postgres,py313-dj61-sqlite,py313-dj61-postgres,py313-dj61-mysql,py313-dj61-pgbouncer,py312-dj60-sqlite

.PHONY: test demo venv lint docs clean

$(VENV)/.ready: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q "tox>=4.20" -e ".[postgres]"
	touch $@

venv: $(VENV)/.ready

test: $(VENV)/.ready
	scripts/system-deps
	$(TOX) run -e $(TEST_ENVS)

lint: $(VENV)/.ready
	$(TOX) run -e lint

docs: $(VENV)/.ready
	$(TOX) run -e docs

demo: $(VENV)/.ready
	$(VENV)/bin/python testproject/demo.py

clean:
	rm -rf $(VENV) .tox .demo build dist *.egg-info

# Side-by-side benchmarks against the peers; not part of `make test`. Builds its own virtualenvs
# under benchmarks/.venvs. Narrow it with BENCH_ARGS="--only drain --systems durq,huey-sqlite".
.PHONY: bench
bench:
	scripts/system-deps
	$(PYTHON) -m benchmarks.run --publish $(BENCH_ARGS)

# The A/B before a change to the worker, executor, store or dialects lands: the previous main
# (or BENCH_COMPARE=REV, or A..B) against the working tree, interleaved; prints a markdown table.
.PHONY: bench-compare
bench-compare:
	$(PYTHON) -m benchmarks.run --compare $(BENCH_COMPARE) $(BENCH_ARGS)
