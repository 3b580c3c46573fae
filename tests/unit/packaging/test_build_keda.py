"""hack/build-keda.sh builds KEDA with the scalers the operator's ScaledObjects use and no others.

KEDA registers every scaler in one switch over one Go package, so a whole build compiles every cloud SDK and
database client it supports (about twice the packages of the four Kubernetes binaries together). The script copies
KEDA's source, removes the other scalers and keeps three cases of the switch; this checks that copy against the
real module (in the Go module cache after `make fetch`) without compiling it: a KEDA release that moved the switch
or the scalers fails here, in the unit tier, not 10 minutes into a cold build. That the trimmed KEDA runs is proved
by tests/e2e/test_autoscaling.py and tests/integration/test_autoscaling.py, which run it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from vlm_operator.desired import autoscaling as A
from vlm_operator.desired.builders import Owner
from vlm_testing.specs import MINIMAL

REPO = Path(__file__).resolve().parents[3]
KEPT = {"prometheus", "cpu", "memory"}


def _trimmed(tmp_path: Path) -> Path:
    out = tmp_path / "keda"
    # GOPROXY=off: the module must already be in the Go module cache (make fetch); a test never downloads.
    env = {**os.environ, "GOPROXY": "off", "VLM_CACHE": str(tmp_path / "cache")}
    r = subprocess.run(["bash", str(REPO / "hack/build-keda.sh"), "--trim-only", str(out)], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"hack/build-keda.sh --trim-only failed (KEDA's module not cached? run make fetch):\n{r.stderr}"
    return out


def test_the_trimmed_keda_keeps_the_three_scalers_and_the_switch_names_only_them(tmp_path: Path) -> None:
    src = _trimmed(tmp_path)
    scalers = src / "pkg/scalers"
    assert {p.name for p in scalers.glob("*.go")} == {
        "scaler.go", "prometheus_scaler.go", "cpu_memory_scaler.go", "vlm_trimmed.go"}
    builder = (src / "pkg/scaling/scalers_builder.go").read_text()
    switch = builder[builder.index("switch triggerType {"):builder.index("// TRIGGERS-END")]
    assert set(re.findall(r'case "([a-z-]+)":', switch)) == KEPT
    assert re.findall(r"scalers\.(New\w+)\(", switch) == ["NewCPUMemoryScaler", "NewCPUMemoryScaler",
                                                           "NewPrometheusScaler"]
    assert "built with the prometheus, cpu and memory scalers only" in switch
    # The kept constructors are defined in the kept files, and the files are Go that gofmt parses (no compile here).
    kept = "".join(p.read_text() for p in scalers.glob("*.go"))
    assert "func NewPrometheusScaler(" in kept and "func NewCPUMemoryScaler(" in kept
    gofmt = shutil.which("gofmt") or str(Path(shutil.which("go") or "go").resolve().parent / "gofmt")
    r = subprocess.run([gofmt, "-l", str(src / "pkg/scaling/scalers_builder.go"), str(scalers / "vlm_trimmed.go")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and not r.stdout.strip(), (r.stdout, r.stderr)


def test_every_trigger_the_operator_writes_is_one_the_trimmed_keda_has() -> None:
    from vlm_operator.api import v1alpha1 as api

    spec = api.parse_spec({**MINIMAL, "telemetry": {"frontendRoles": ["tokenizer_manager"]},
                           "autoscaling": {"maxReplicas": 4, "targets": {
                               "schedulerBusyPercent": 90, "frontendBusyPercent": 30, "queuePerReplica": 4,
                               "kvCacheUsagePercent": 80, "ttftP95": "1500ms"}}})
    obj = A.build_scaled_object(Owner("qwen", "ml", "uid-1"), spec.autoscaling, "http://prom:9090", frontend=True)
    types = {t["type"] for t in obj["spec"]["triggers"]}
    assert len(obj["spec"]["triggers"]) == 5 and types <= KEPT, types
