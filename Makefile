# The two entry points: `make test` (install everything, run the whole suite) and `make demo`; releasing: `make dist`
# and `make image` (docs/releasing.md).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
CONSTRAINTS := constraints.txt
INSTALL_INPUTS := setup.cfg setup.py pyproject.toml $(CONSTRAINTS) nodeagent/podresources/api.proto
PROMTOOL := $(BIN)/promtool
PROMETHEUS := $(BIN)/prometheus
VERSION := $(shell sed -n 's/^version = //p' setup.cfg)
IMAGE ?= ghcr.io/kube-gpusharing/gpusharing

.PHONY: test lint demo bench scale clean constraints test-python test-lowest plugin tools dist image manifests

# One virtualenv, one stamp per extra installed in it: the package alone (the demo), with its test extra (the suite),
# with its release extra (make dist).
# PIP_BUILD_CONSTRAINT pins what builds the package too (setup.py's grpcio-tools, whose stubs need a grpcio as recent).
$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(VENV)/.runtime: $(INSTALL_INPUTS) | $(BIN)/python
	PIP_BUILD_CONSTRAINT=$(CURDIR)/$(CONSTRAINTS) $(BIN)/pip install --quiet -c $(CONSTRAINTS) -e .
	touch $@

$(VENV)/.installed: $(INSTALL_INPUTS) | $(BIN)/python
	PIP_BUILD_CONSTRAINT=$(CURDIR)/$(CONSTRAINTS) $(BIN)/pip install --quiet -c $(CONSTRAINTS) -e '.[test]'
	touch $@

$(VENV)/.release: $(INSTALL_INPUTS) | $(BIN)/python
	PIP_BUILD_CONSTRAINT=$(CURDIR)/$(CONSTRAINTS) $(BIN)/pip install --quiet -c $(CONSTRAINTS) -e '.[release]'
	touch $@

test: lint tools
	$(BIN)/python -m pytest

# The kustomize install's files (manifests/) rendered from the Helm chart, their one source (release/manifests.py);
# tests/manifests/test_rendered.py fails, under `make test`, when the committed ones differ from a fresh render.
manifests: $(VENV)/.installed
	$(BIN)/python -m release.manifests

# The static checks, before the suite (docs/development.md#static-checks): lint errors, type errors, and imports
# that break a layer's contract (.importlinter) each fail it.
lint: $(VENV)/.installed
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports

# promtool, which tests/manifests/test_monitoring.py checks the alerts with and tests/timekeeper/test_dcgm.py the
# utilisation query, and the Prometheus server tests/timekeeper/test_prometheus_source.py scrapes fake DCGM series
# with: the machine's, else the binaries alone from Debian's prometheus package. Without them those tests are
# skipped, and fail under CI=true.
tools: $(VENV)/.installed
	@$(MAKE) --no-print-directory $(PROMTOOL) $(PROMETHEUS) VENV=$(VENV) || echo "promtool or prometheus could not be installed: the tests that need them will be skipped"

$(PROMTOOL) $(PROMETHEUS): | $(VENV)/.installed
	@name=$(notdir $@); if command -v $$name >/dev/null; then ln -sf "$$(command -v $$name)" $@; else \
	  tmp=$$(mktemp -d) && cd $$tmp && \
	  { apt-get download prometheus >/dev/null 2>&1 || { apt-get update -qq && apt-get download prometheus >/dev/null; }; } && \
	  dpkg-deb -x prometheus_*.deb root && cp root/usr/bin/$$name $(CURDIR)/$@ && rm -rf $$tmp; fi

demo: $(VENV)/.runtime
	$(BIN)/python -m demo

bench: $(VENV)/.installed
	$(BIN)/python bench/webhook_load.py
	$(BIN)/python bench/webhook_memory.py
	$(BIN)/python bench/timekeeper_ingest.py
	$(BIN)/python bench/budget_reads.py
	$(BIN)/python bench/meter_footprint.py
	$(BIN)/python bench/reservations.py
	$(BIN)/python bench/cluster_scale.py
	$(BIN)/python bench/fairshare.py

# The cluster tier's scale run, larger than CI runs it (tests/cluster/test_scale.py prints its figures).
SCALE_NODES ?= 200
SCALE_PODS ?= 2000
scale: $(VENV)/.installed
	KUBEBUILDER_ASSETS=$${KUBEBUILDER_ASSETS:-$$(../shared/kube/unpack)} GPUSHARING_SCALE_NODES=$(SCALE_NODES) \
	  GPUSHARING_SCALE_PODS=$(SCALE_PODS) $(BIN)/python -m pytest -s -q -p no:cacheprovider tests/cluster/test_scale.py

# The archive krew's manifest (plugins/gpusharing.yaml) points at; prints its sha256.
plugin:
	$(PYTHON) plugins/build.py dist

# Every release artifact of the version in setup.cfg, in dist/: sdist and wheel (twine-checked, the wheel installed
# alone in a fresh virtualenv), the packaged chart with its index.yaml, the krew archive, SHA256SUMS.
# Timestamps are the last commit's (SOURCE_DATE_EPOCH), so that a rebuild gives the same bytes.
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 315532800)
dist: $(VENV)/.release
	SOURCE_DATE_EPOCH=$(SOURCE_DATE_EPOCH) $(BIN)/python -m release.dist dist

# The one image of every role, tagged with the version; BASE=python:3.12-slim-bookworm@sha256:… pins the base by digest.
image:
	docker build $(if $(BASE),--build-arg BASE=$(BASE) )-t $(IMAGE):$(VERSION) .

# Pin what is tested: the newest versions setup.cfg allows, as installed now on every supported Python (PYTHONS,
# pyenv's by default), merged with python_version markers where they differ (release/constraints.py).
PYENV_ROOT ?= $(HOME)/.pyenv
PYTHONS ?= $(foreach minor,3.10 3.11 3.12 3.13,$(lastword $(wildcard $(PYENV_ROOT)/versions/$(minor).*/bin/python3)))
constraints:
	@test -n "$(PYTHONS)" || { echo "no Python 3.10-3.13 found under $(PYENV_ROOT): name them, make constraints PYTHONS='...'" >&2; exit 2; }
	rm -rf .venv-constraints && mkdir .venv-constraints
	for python in $(PYTHONS); do \
	  minor=$$($$python -c 'import sys; print("%d.%d" % sys.version_info[:2])') && venv=.venv-constraints/$$minor && \
	  $$python -m venv $$venv && $$venv/bin/pip install --quiet --upgrade pip && \
	  $$venv/bin/pip install --quiet -e '.[test,release]' && \
	  $$venv/bin/pip freeze --all --exclude-editable | grep -v '^pip==' > $$venv.txt || exit 1; \
	done
	{ sed -n '1,/^[^#]/{/^#/p}' $(CONSTRAINTS); $$(ls -d .venv-constraints/3.*/ | head -1)bin/python -m release.constraints .venv-constraints; } > $(CONSTRAINTS).new
	mv $(CONSTRAINTS).new $(CONSTRAINTS)
	rm -rf .venv-constraints

# The suite on another interpreter, in a virtualenv of its own: make test-python PY=/path/to/python3.13
PY ?= python3
PY_MINOR = $(shell $(PY) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)
test-python:
	@test -n "$(PY_MINOR)" || { echo "PY=$(PY) does not run: make test-python PY=/path/to/python3.X" >&2; exit 2; }
	$(MAKE) --no-print-directory test PYTHON=$(PY) VENV=.venv-py$(PY_MINOR)

# The suite on the lower bounds of setup.cfg (each `>=` installed as `==`), so that they are known to work; the node
# agent's stubs generated by the lowest grpcio-tools, which needs no grpcio newer than the lowest.
test-lowest:
	$(PYTHON) -m venv .venv-lowest
	.venv-lowest/bin/pip install --quiet --upgrade pip
	.venv-lowest/bin/python -c 'import configparser, re; c = configparser.ConfigParser(); c.read("setup.cfg"); \
	    wanted = c["options"]["install_requires"].split() + c["options.extras_require"]["test"].split(); \
	    wanted += [r for r in c["options.extras_require"]["release"].split() if r.startswith("grpcio-tools")]; \
	    print("\n".join(re.sub(r"\[.*\]", "", r).replace(">=", "==") for r in wanted if ">=" in r))' > .venv-lowest/lower-bounds.txt
	PIP_BUILD_CONSTRAINT=$(CURDIR)/.venv-lowest/lower-bounds.txt .venv-lowest/bin/pip install --quiet -c .venv-lowest/lower-bounds.txt -e '.[test]'
	.venv-lowest/bin/python -m pytest

clean:
	rm -rf $(VENV) .venv-py* .venv-lowest .demo *.egg-info dist .mypy_cache .ruff_cache .import_linter_cache
