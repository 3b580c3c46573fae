"""hack/testbed_lib (the testbed's own code, standard library only, run by `hack/testbed` as a script) as the
package `testbed_lib`, loaded from its file path so the harness needs no change to sys.path."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

from vlm_testing import REPO

LIB = REPO / "hack" / "testbed_lib"
TESTBED = REPO / "hack" / "testbed"


def _load() -> ModuleType:
    if "testbed_lib" in sys.modules:
        return sys.modules["testbed_lib"]
    spec = importlib.util.spec_from_file_location("testbed_lib", LIB / "__init__.py",
                                                  submodule_search_locations=[str(LIB)])
    mod = importlib.util.module_from_spec(spec)
    sys.modules["testbed_lib"] = mod
    spec.loader.exec_module(mod)
    return mod


testbed_lib = _load()

from testbed_lib import layout, netns  # noqa: E402  (found through the package loaded above)

__all__ = ["LIB", "TESTBED", "layout", "netns", "testbed_lib"]
