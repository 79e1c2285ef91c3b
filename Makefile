# The two commands of the README, and the pieces they are made of.
# Everything installs into .venv and ~/.cache/pdkit; nothing outside the checkout is changed
# except the packages the lab needs (see .ci/).

PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: demo test venv contract-env clean

# Command 1: the main job on this machine, no GPU needed.
demo: $(STAMP)
	$(VENV)/bin/pdkit validate inventories/cluster.py
	$(VENV)/bin/pdkit render inventories/cluster.py --out build/
	@echo "rendered files for every host are under build/<host>/ (try: cat build/gpu01/etc/systemd/system/pdkit-engine-decode.service)"

# Command 2: every test, including SGLang's and smg's own argument parsers.
test: $(STAMP) contract-env
	$(VENV)/bin/python -m pytest

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $(STAMP)

contract-env:
	bash .ci/contract-env.sh

clean:
	rm -rf build $(VENV)
