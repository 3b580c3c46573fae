"""Every bench script has a smoke test: a bench mode no test runs rots (bench/operator_scale.py --direct called
a builder with an argument it had lost, and nothing noticed until a scale run). A script with command-line flags
under bench/ or bench/gpu/ must be named by a test in tests/unit/bench/ or tests/integration/test_bench_*.py."""

from __future__ import annotations

from pathlib import Path

from vlm_testing import REPO as ROOT


def _scripts() -> list[Path]:
    return sorted(p for d in (ROOT / "bench", ROOT / "bench" / "gpu") for p in d.glob("*.py")
                  if "argparse" in p.read_text())


def test_every_bench_script_with_flags_is_named_by_a_test():
    tests = [*(ROOT / "tests" / "unit" / "bench").glob("test_*.py"),
             *(ROOT / "tests" / "integration").glob("test_bench_*.py")]
    text = "\n".join(t.read_text() for t in tests if t.name != Path(__file__).name)
    scripts = _scripts()
    assert {p.name for p in scripts} >= {"operator_scale.py", "webhook_admission.py", "standin_loop.py"}
    untested = [str(p.relative_to(ROOT)) for p in scripts
                if f'load_bench("{p.stem}"' not in text and f'"{p.name}"' not in text]
    assert not untested, f"bench scripts no test runs: {untested}"
