# The two entry points: `make test` (install everything, run the whole suite) and `make demo`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test demo bench clean

$(STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest

demo: $(STAMP)
	$(BIN)/python -m demo

bench: $(STAMP)
	$(BIN)/python bench/webhook_load.py
	$(BIN)/python bench/webhook_memory.py
	$(BIN)/python bench/timekeeper_ingest.py
	$(BIN)/python bench/meter_footprint.py

clean:
	rm -rf $(VENV) .demo *.egg-info
