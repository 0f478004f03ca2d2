# The two entry points: `make test` (install everything, run the whole suite) and `make demo`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CONSTRAINTS := constraints.txt
PROMTOOL := $(BIN)/promtool

.PHONY: test demo bench scale clean constraints test-python test-lowest plugin tools

$(STAMP): setup.cfg pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c $(CONSTRAINTS) -e '.[test]'
	touch $(STAMP)

test: $(STAMP) tools
	$(BIN)/python -m pytest

# promtool, which tests/manifests/test_monitoring.py checks the alerts with: the machine's, else the binary alone
# from Debian's prometheus package (not the server). Without it those tests are skipped, and fail under CI=true.
tools: $(STAMP)
	@$(MAKE) --no-print-directory $(PROMTOOL) || echo "promtool could not be installed: the alert tests will be skipped"

$(PROMTOOL): | $(STAMP)
	@if command -v promtool >/dev/null; then ln -sf "$$(command -v promtool)" $@; else \
	  tmp=$$(mktemp -d) && cd $$tmp && \
	  { apt-get download prometheus >/dev/null 2>&1 || { apt-get update -qq && apt-get download prometheus >/dev/null; }; } && \
	  dpkg-deb -x prometheus_*.deb root && cp root/usr/bin/promtool $(CURDIR)/$@ && rm -rf $$tmp; fi

demo: $(STAMP)
	$(BIN)/python -m demo

bench: $(STAMP)
	$(BIN)/python bench/webhook_load.py
	$(BIN)/python bench/webhook_memory.py
	$(BIN)/python bench/timekeeper_ingest.py
	$(BIN)/python bench/meter_footprint.py
	$(BIN)/python bench/cluster_scale.py

# The cluster tier's scale run, larger than CI runs it (tests/cluster/test_scale.py prints its figures).
SCALE_NODES ?= 200
SCALE_PODS ?= 2000
scale: $(STAMP)
	KUBEBUILDER_ASSETS=$${KUBEBUILDER_ASSETS:-$$(../shared/kube/unpack)} GPUSHARING_SCALE_NODES=$(SCALE_NODES) \
	  GPUSHARING_SCALE_PODS=$(SCALE_PODS) $(BIN)/python -m pytest -s -q -p no:cacheprovider tests/cluster/test_scale.py

# The archive krew's manifest (plugins/gpusharing.yaml) points at; prints its sha256.
plugin:
	$(PYTHON) plugins/build.py dist

# Pin what is tested: the newest versions setup.cfg allows, as installed now.
constraints:
	rm -rf .venv-constraints
	$(PYTHON) -m venv .venv-constraints
	.venv-constraints/bin/pip install --quiet --upgrade pip
	.venv-constraints/bin/pip install --quiet -e '.[test]'
	{ sed -n '1,/^[^#]/{/^#/p}' $(CONSTRAINTS); .venv-constraints/bin/pip freeze --exclude-editable; } > $(CONSTRAINTS).new
	mv $(CONSTRAINTS).new $(CONSTRAINTS)
	rm -rf .venv-constraints

# The suite on another interpreter, in a venv of its own: make test-python PY=/path/to/python3.13
PY ?= python3
PY_VENV = .venv-py$(shell $(PY) -c 'import sys; print("%d.%d" % sys.version_info[:2])')
test-python:
	$(PY) -m venv $(PY_VENV)
	$(PY_VENV)/bin/pip install --quiet --upgrade pip
	$(PY_VENV)/bin/pip install --quiet -c $(CONSTRAINTS) -e '.[test]'
	$(PY_VENV)/bin/python -m pytest

# The suite on the lower bounds of setup.cfg (each `>=` installed as `==`), so that they are known to work.
test-lowest:
	$(PYTHON) -m venv .venv-lowest
	.venv-lowest/bin/pip install --quiet --upgrade pip
	.venv-lowest/bin/python -c 'import configparser, re; c = configparser.ConfigParser(); c.read("setup.cfg"); \
	    wanted = c["options"]["install_requires"].split() + c["options.extras_require"]["test"].split(); \
	    print("\n".join(re.sub(r"\[.*\]", "", r).replace(">=", "==") for r in wanted if ">=" in r))' > .venv-lowest/lower-bounds.txt
	.venv-lowest/bin/pip install --quiet -c .venv-lowest/lower-bounds.txt -e '.[test]'
	.venv-lowest/bin/python -m pytest

clean:
	rm -rf $(VENV) .venv-py* .venv-lowest .demo *.egg-info dist
