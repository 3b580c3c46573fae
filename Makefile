# vlm-operator: the two commands a user needs are `make demo` (main job on a
# local control plane) and `make test` (everything CI runs). Both set up what
# they need first; setup is cached and idempotent.
SHELL := /bin/bash
PY ?= python3
PYTEST_ARGS ?=

.PHONY: setup deps binaries tools lint crds test test-unit test-integration test-e2e demo demo-down bench testbed-up testbed-down images

setup: deps binaries

deps:
	bash hack/install-system-deps.sh
	$(PY) -m pip install -q -e '.[test]'

binaries:
	bash hack/build-binaries.sh

tools:
	bash hack/build-binaries.sh --stage tools

crds:
	$(PY) -m vlm_operator.crdgen

lint:
	ruff check .
	lint-imports
	$(PY) -m vlm_operator.crdgen --check
	$(PY) -m vlm_operator.alerts --check
	$(PY) dashboards/build.py --check
	$(PY) hack/chart-readme.py --check

# Unit (fast and slow) and SGLang wheel compatibility tiers alone (the py-spy measurements run before the
# control plane starts), then integration and e2e on pytest-xdist workers sharing one testbed, then the tests
# that need the testbed to themselves (hack/run-tests.sh; docs/testbed.md, "Test tiers and their budgets").
# Only the tools the unit tier needs are built in front; the control plane's binaries are built by the unit
# session in the background (nice 19) while the unit tier runs, the Prometheus Operator after them while the
# first integration tests run (testing/vlm_testing/binaries.py). `$(PY) -m pytest` alone still runs every tier, one test at
# a time (pyproject.toml's testpaths).
test: deps tools lint
	PY=$(PY) bash hack/run-tests.sh $(PYTEST_ARGS)

test-unit:
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

test-integration: setup
	$(PY) -m pytest tests/integration $(PYTEST_ARGS)

test-e2e: setup
	$(PY) -m pytest tests/e2e $(PYTEST_ARGS)

testbed-up: setup
	hack/testbed up

testbed-down:
	hack/testbed down

demo: setup
	$(PY) hack/demo.py up

demo-down:
	$(PY) hack/demo.py down

bench:
	$(PY) bench/gate_quality.py
	$(PY) bench/sidecar_overhead.py

# The Dockerfile's two images without a Docker engine or a registry: buildah on bases assembled from Debian
# packages, exported as OCI archives under ~/.cache/vlm-operator/images/out and checked (the operator's entry
# point starts, the sidecar's samples the SGLang stand-in). Needs root; not part of `make test`
# (docs/packaging.md, "Images built here").
images:
	bash hack/build-images.sh
