# The two commands of the README, and the pieces they are made of.
# Python packages go into .venv and ~/.cache/pdkit; the lab needs root and a few Debian
# packages (.ci/lab-prereqs.sh).

PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: lab test lint venv contract-env lab-prereqs monitoring-prereqs grafana-schema render clean

# Command 1: the main job on local test hosts, no GPU needed: lab up, deploy, one chat completion.
lab: $(STAMP) lab-prereqs
	$(VENV)/bin/pdkit validate inventories/lab.py
	$(VENV)/bin/pdkit lab up
	$(VENV)/bin/pyinfra inventories/lab.py deploy/pd.py -y
	$(VENV)/bin/pdkit chat inventories/lab.py

# Command 2: every test: units, SGLang's and smg's own parsers, the sim behind the real router, the lab.
# Two pytest runs: the unit tests in UNIT_WORKERS processes (pytest-xdist; most of them wait on
# sims, routers and subprocesses), then the lab tests in one process (one lab per session, its
# tests in file order). The lab runs even when a unit test failed; make fails if either did.
# UNIT_ARGS / LAB_ARGS: extra pytest arguments for each run (.ci/run: a JUnit report each).
# Three workers on CI's two cores: the unit tests wait on subprocesses often enough that a third
# pays (docs/benchmarks.md, "What CI costs": 282.5 s against 355.5 s with two).
UNIT_WORKERS ?= 3
UNIT_ARGS ?=
LAB_ARGS ?=
test: $(STAMP) contract-env lab-prereqs monitoring-prereqs grafana-schema
	@# the repository's own modules compiled once: with PYTHONDONTWRITEBYTECODE=1 (so on CI) no
	@# process keeps what it compiles, and each pytest worker, pyinfra run, pdkit command and sim
	@# compiled pdkit from source again (docs/benchmarks.md, "What CI costs"). Only a speed-up: a file
	@# that does not compile is printed here (-q lists errors only) and reported by pytest below.
	-$(VENV)/bin/python -m compileall -q -j 0 pdkit tests deploy roles inventories benchmarks gpu
	unit=0; lab=0; \
	$(VENV)/bin/python -m pytest -n $(UNIT_WORKERS) --ignore=tests/lab $(UNIT_ARGS) || unit=$$?; \
	$(VENV)/bin/python -m pytest tests/lab $(LAB_ARGS) || lab=$$?; \
	echo "make test: unit tests exit $$unit, lab tests exit $$lab"; \
	[ $$unit = 0 ] && [ $$lab = 0 ]

# The linter and the type checker (ruff and mypy, pinned in pyproject's test extras; their rules in
# [tool.ruff] and [tool.mypy]).
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy pdkit

# Render every file pdkit would write for the example 8-GPU cluster into build/ (no host contacted).
render: $(STAMP)
	$(VENV)/bin/pdkit validate inventories/cluster.py
	$(VENV)/bin/pdkit render inventories/cluster.py --out build/

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $(STAMP)

contract-env:
	bash .ci/contract-env.sh

lab-prereqs:
	bash .ci/lab-prereqs.sh

# promtool (Debian's prometheus package) for the rule and config checks; its daemon stays off
monitoring-prereqs:
	bash .ci/monitoring-prereqs.sh

# Grafana's dashboard schema (@grafana/schema from npm, as JSON Schema) and ajv, pinned by
# .ci/grafana-schema/package-lock.json, for the dashboard check
grafana-schema:
	bash .ci/grafana-schema.sh

clean:
	rm -rf build $(VENV)
