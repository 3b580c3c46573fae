# vlm-operator: the two commands a user needs are `make demo` (main job on a
# local control plane) and `make test` (everything CI runs). Both set up what
# they need first; setup is cached and idempotent.
SHELL := /bin/bash
# The project's own virtualenv: every target runs its Python, ruff and lint-imports, never the system's. Made by
# the system python3 (SYSTEM_PYTHON) once; the project is installed into it (`uv pip install -e '.[test]'`, uv
# itself pip-installed into the venv first) again only when pyproject.toml is newer than the last install (the
# stamp file). uv, not pip: every CI run is a fresh clone, so a fresh venv (docs/testbed.md, "Setup").
VENV ?= .venv
UV_VERSION ?= 0.13.10
SYSTEM_PYTHON ?= python3
PY := $(VENV)/bin/python
VENV_STAMP := $(VENV)/.installed
# Scripts that run `python3` (hack/*, tests' subprocesses) find the venv's first, as with an activated venv.
export PATH := $(abspath $(VENV))/bin:$(PATH)
PYTEST_ARGS ?=

.PHONY: setup deps system-deps venv binaries tools demo-binaries fetch lint crds test build-behind test-unit test-integration \
	test-e2e demo demo-down bench testbed-up testbed-down images

setup: deps binaries fetch

deps: system-deps venv

system-deps:
	bash hack/install-system-deps.sh

venv: $(VENV_STAMP)

# Order-only on system-deps: it installs python3-venv where the system Python lacks ensurepip.
$(VENV_STAMP): pyproject.toml | system-deps
	@test -x $(PY) || { echo "[make] $(SYSTEM_PYTHON) -m venv $(VENV)"; $(SYSTEM_PYTHON) -m venv $(VENV); }
	@test -x $(VENV)/bin/uv || $(PY) -m pip install -q --disable-pip-version-check 'uv==$(UV_VERSION)'
	$(VENV)/bin/uv pip install -q --python $(PY) -e '.[test]'
	@touch $@

binaries:
	bash hack/build-binaries.sh

tools:
	bash hack/build-binaries.sh --stage tools

# What the demo runs (hack/demo.py): the control plane and the sidecar's py-spy. Not helm, the Prometheus
# Operator, Prometheus with kubernetes_sd (the demo runs Debian's, file_sd) or Argo Rollouts.
demo-binaries:
	bash hack/build-binaries.sh --stage pyspy,cluster

# Everything the tests read that comes from a registry other than the Go build's: the third-party CRDs (Go module
# proxy), the SGLang wheels of the compat tier, checkov's own venv and the wheels of the images' locks that the
# Dockerfile's install steps are replayed with (PyPI). Cached under ~/.cache/vlm-operator;
# a warm run makes no network call. The tests never fetch: they fail naming this target when something is missing.
fetch: venv
	bash hack/fetch-crds.sh >/dev/null
	PYTHON=$(PY) bash hack/fetch-sglang-wheels.sh >/dev/null
	PYTHON=$(PY) bash hack/fetch-checkov.sh >/dev/null
	PYTHON=$(PY) bash hack/fetch-image-wheels.sh >/dev/null

crds: venv
	$(PY) -m vlm_operator.api.crdgen

lint: venv
	$(VENV)/bin/ruff check --no-cache .
	$(VENV)/bin/lint-imports
	$(PY) -m vlm_operator.api.crdgen --check
	$(PY) -m vlm_operator.desired.alerts --check
	$(PY) dashboards/build.py --check
	$(PY) hack/chart-readme.py --check
	$(PY) hack/gen-docs.py --check

# The unit tier's live py-spy tests alone (before the control plane starts), then integration and e2e on
# pytest-xdist workers sharing one testbed with the rest of unit and the SGLang wheel compatibility tier beside
# them on 2 xdist workers at nice 19, the py-spy-bound e2e tests one at a time, then the tests that need the testbed to themselves
# (hack/run-tests.sh; docs/testbed.md, "Test tiers and their budgets").
# Only the tools the unit tier needs are built in front. The control plane's binaries, then the Prometheus
# Operator, Prometheus, the Argo Rollouts controller, Flagger and KEDA build in the background from the very start
# (hack/build-behind.sh, before the virtualenv: on a cold machine the Go build overlaps the setup as well as the
# unit tier and the first integration tests; testing/vlm_testing/binaries.py). The tools (py-spy's cargo build,
# helm) and the fetches (mostly waiting on registries) run side by side. `$(PY) -m pytest` alone still runs every
# tier, one test at a time (pyproject.toml's testpaths).
test: build-behind deps
	$(MAKE) --no-print-directory -j2 tools fetch
	$(MAKE) --no-print-directory lint
	PY=$(PY) bash hack/run-tests.sh $(PYTEST_ARGS)

build-behind:
	bash hack/build-behind.sh

test-unit: venv tools fetch
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

test-integration: setup
	$(PY) -m pytest tests/integration $(PYTEST_ARGS)

test-e2e: setup
	$(PY) -m pytest tests/e2e $(PYTEST_ARGS)

testbed-up: deps
	bash hack/build-binaries.sh --stage cluster
	$(PY) hack/testbed up

testbed-down: venv
	$(PY) hack/testbed down

demo: deps demo-binaries
	$(PY) hack/demo.py up

demo-down: venv
	$(PY) hack/demo.py down

bench: venv
	$(PY) bench/gate_quality.py
	$(PY) bench/sidecar_overhead.py

# The Dockerfile's two images without a Docker engine or a registry: buildah on bases assembled from Debian
# packages, exported as OCI archives under ~/.cache/vlm-operator/images/out and checked (the operator's entry
# point starts, the sidecar's samples the SGLang stand-in). Needs root; not part of `make test`
# (docs/packaging.md, "Images built here").
images: venv
	PYTHON=$(PY) bash hack/build-images.sh
