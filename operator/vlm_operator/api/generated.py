"""Files generated from code (the CRD, the alert rules): write them, or check the committed copies."""

from __future__ import annotations

import difflib
import sys
from collections.abc import Iterable
from pathlib import Path


def write_or_check(root: Path, outputs: Iterable[Path | str], text: str, *, check: bool, command: str) -> int:
    """Write `text` to each output under `root`; with check, print a diff and return 1 when one differs."""
    status = 0
    for rel in outputs:
        path = root / rel
        if check:
            current = path.read_text() if path.exists() else ""
            if current != text:
                diff = difflib.unified_diff(current.splitlines(), text.splitlines(), str(path), "generated", lineterm="", n=1)
                print("\n".join(list(diff)[:40]), file=sys.stderr)
                print(f"{path} is stale: run `{command}`", file=sys.stderr)
                status = 1
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path}")
    return status
