"""The project's test harness: what tests, benchmarks and hack/ scripts share, installed with the `test` extra
(`make venv`, `uv pip install -e '.[test]'`; pytest also finds it through pyproject.toml's `pythonpath`). Never
shipped in an image: the Dockerfile builds its wheel from operator/ and sidecar/ alone.

- `cluster`: the pytest plugin for the local control plane (`cluster`, `kube`, `namespace`, `wait_for`,
  `gpu_nodes`); `testbed`: hack/testbed_lib, the testbed's own code; `binaries`: the control plane's build
  behind the tests.
- `operator_proc`: the real operator as a process; `api_recorder`: a recording proxy in front of the API server;
  `jsonhttp`: tiny JSON endpoints; `specfuzz`: VLMService spec mutants.
- `fakekube`: the one fake cluster (`FakeKube`, and `FakeCluster`, a reconcile loop over it).
- `standin/`: the SGLang scheduler stand-in and what the e2e tier runs around it (pod mapper, monitoring,
  Prometheus Operator, hub); `sidecar`, `loopsim`: the sidecar tests' stand-in control and loop simulator.
- `e2e`, `integration`, `unit`: helpers that tests of a tier share (specs, waits, the chart), so no test imports
  another test module.
"""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
