# The two entry points: `make test` (install everything, run the whole suite) and `make demo`; `make test-fast`, the
# quick loop of the tests that need no control plane and no PostgreSQL; releasing: `make dist` and `make image`
# (docs/releasing.md).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
CONSTRAINTS := constraints.txt
INSTALL_INPUTS := setup.cfg setup.py pyproject.toml $(CONSTRAINTS) nodeagent/podresources/api.proto
PROMTOOL := $(BIN)/promtool
PROMETHEUS := $(BIN)/prometheus
VERSION := $(shell sed -n 's/^version = //p' setup.cfg)
IMAGE ?= ghcr.io/kube-gpusharing/gpusharing

.PHONY: test test-fast fast-tier postgres-lane e2e-lane cluster-lane lint demo bench scale clean constraints test-python test-lowest plugin tools dist image manifests focus-validator

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

# The suite's tiers, markers tests/conftest.py gives each test (docs/development.md#the-tiers): `e2e` and `cluster`
# need a control plane (KUBEBUILDER_ASSETS), `postgres` a PostgreSQL server; `.venv/bin/pytest -m TIER` runs one.
# The tests write bytecode caches (__pycache__/, ignored by git) even where PYTHONDONTWRITEBYTECODE is set, as
# Python's images set it: else each xdist worker, and every process a test starts, compiles the project anew.
PYTEST = PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest
FAST := not e2e and not cluster and not postgres
POSTGRES := postgres and not e2e and not cluster
# The folders that hold the control-plane tiers alone: where those are deselected, not even imported.
NO_CONTROL_PLANE := --ignore=tests/e2e --ignore=tests/cluster
# xdist workers of the tiers that run in parallel: one more than this machine's two cores, as tests wait on the
# processes they start; a fourth cost more CPU than it saved in waits (each worker collects the whole suite).
# loadscope keeps a module's tests on one worker (its module-scoped fixtures set up once), in the order collected
# (tests/conftest.py puts the longest modules first).
WORKERS ?= 3
XDIST = -n $(WORKERS) --dist loadscope --no-loadscope-reorder
TIMES = $(VENV)/test-times
# $(call timed,PART,COMMAND): COMMAND, and PART's wall-clock seconds added to $(TIMES) (FAILED too, if it failed).
timed = start=$$(date +%s); $(2); status=$$?; \
	printf '%-62s %5d s%s\n' '$(1)' $$(( $$(date +%s) - start )) "$$([ $$status = 0 ] || echo "  FAILED (exit $$status)")" >> $(TIMES); \
	exit $$status

# Every tier: the static checks and the tools, the fast tier alone (as `make test-fast` runs it), then two lanes side
# by side: the cluster tier, the longest, on a control plane of its own; and the postgres tier in parallel, then the
# end-to-end tier on its own control plane. Each tier's output is printed whole when it ends (make -O), with its 25
# slowest tests; then each part's wall-clock seconds. A tier that fails does not stop the others.
test: $(VENV)/.installed
	@rm -f $(TIMES)
	@$(call timed,lint (ruff, mypy, import-linter),$(MAKE) --no-print-directory lint)
	@$(call timed,tools (promtool, prometheus, focus-validator),$(MAKE) --no-print-directory tools)
	-@$(MAKE) --no-print-directory fast-tier DURATIONS=--durations=25
	@$(call timed,the lanes (cluster | postgres then e2e),$(MAKE) --no-print-directory -j2 -Otarget cluster-lane e2e-lane)
	@echo; echo "make test: wall-clock seconds of each part"; cat $(TIMES); ! grep -q FAILED $(TIMES)

# The quick loop: every test that needs no control plane and no PostgreSQL, in parallel.
test-fast: tools
	@rm -f $(TIMES)
	@$(MAKE) --no-print-directory fast-tier; status=$$?; cat $(TIMES); exit $$status

fast-tier:
	@$(call timed,fast tier ($(FAST); $(WORKERS) workers),$(PYTEST) $(XDIST) $(NO_CONTROL_PLANE) -m "$(FAST)" $(DURATIONS))

# `make test`'s lanes (a failed tier recorded, the rest still run: the leading `-`).
postgres-lane: tools
	-@$(call timed,postgres tier ($(WORKERS) workers),$(PYTEST) $(XDIST) $(NO_CONTROL_PLANE) -m "$(POSTGRES)" --durations=25)

e2e-lane: postgres-lane
	-@$(call timed,e2e tier (its own control plane),$(PYTEST) -m e2e --durations=25)

cluster-lane: $(VENV)/.installed
	-@$(call timed,cluster tier (control plane with kube-scheduler and nodes),$(PYTEST) -m cluster --durations=25)

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
# with: the machine's, else the binaries alone from Debian's prometheus package; and focus-validator (below). Without
# them the tests that need them are skipped, and fail under CI=true.
tools: $(VENV)/.installed
	@$(MAKE) --no-print-directory $(PROMTOOL) $(PROMETHEUS) VENV=$(VENV) || echo "promtool or prometheus could not be installed: the tests that need them will be skipped"
	@$(MAKE) --no-print-directory focus-validator || echo "focus-validator could not be installed: its tests will be skipped"

$(PROMTOOL) $(PROMETHEUS): | $(VENV)/.installed
	@name=$(notdir $@); if command -v $$name >/dev/null; then ln -sf "$$(command -v $$name)" $@; else \
	  tmp=$$(mktemp -d) && cd $$tmp && \
	  { apt-get download prometheus >/dev/null 2>&1 || { apt-get update -qq && apt-get download prometheus >/dev/null; }; } && \
	  dpkg-deb -x prometheus_*.deb root && cp root/usr/bin/$$name $(CURDIR)/$@ && rm -rf $$tmp; fi

# focus-validator, FOCUS 1.2's official validator, which tests/timekeeper/chargeback/test_focus.py runs on the FOCUS
# export (docs/chargeback.md#the-focus-export): in a virtualenv of its own, at the versions requirements-focus.txt
# pins, as it needs Python 3.12 (python3.12 on the PATH, else pyenv's; FOCUS_PYTHON= to name one), numpy below 2 and
# pyarrow below 20.
FOCUS_VENV := .venv-focus
FOCUS_PYTHON ?= $(firstword $(foreach python,python3.12 $(wildcard $(PYENV_ROOT)/versions/3.12.*/bin/python3),\
	$(shell $(python) -c 'import sys; print(sys.executable if sys.version_info[:2] == (3, 12) else "")' 2>/dev/null)))
focus-validator: $(FOCUS_VENV)/.installed

$(FOCUS_VENV)/.installed: requirements-focus.txt
	@test -n "$(FOCUS_PYTHON)" || { echo "focus-validator needs Python 3.12: none runs as python3.12 or from" \
	  "$(PYENV_ROOT)/versions/3.12.* (make focus-validator FOCUS_PYTHON=/path/to/python3.12)" >&2; exit 1; }
	rm -rf $(FOCUS_VENV)
	$(FOCUS_PYTHON) -m venv $(FOCUS_VENV)
	$(FOCUS_VENV)/bin/pip install --quiet --upgrade pip
	$(FOCUS_VENV)/bin/pip install --quiet -r requirements-focus.txt
	touch $@

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
	$(BIN)/python bench/chargeback.py
	$(BIN)/python bench/statements.py

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
	rm -rf $(VENV) .venv-py* .venv-lowest .venv-focus .demo *.egg-info dist .mypy_cache .ruff_cache .import_linter_cache
