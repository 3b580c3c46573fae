"""Flamegraph SVGs from collapsed stacks, a differential view, and speedscope JSON.

Self-contained (no flamegraph.pl, no JS): boxes with <title> tooltips, readable in a browser or
an image viewer. The diff view draws the current profile's shape and colours each frame by how its
inclusive share changed against the baseline: red grew, blue shrank (as in Brendan Gregg's
differential flame graphs and Pyroscope's diff view).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from xml.sax.saxutils import escape

WIDTH = 1200
ROW = 16
PAD = 30
MIN_FRACTION = 0.001  # frames narrower than 0.1% of the total are not drawn


@dataclass
class Node:
    name: str
    value: float = 0.0
    children: dict[str, Node] = field(default_factory=dict)


def build_tree(stacks: dict[tuple[str, ...], float]) -> Node:
    root = Node("all")
    for stack, weight in stacks.items():
        if weight <= 0:
            continue
        root.value += weight
        node = root
        for frame in stack:
            node = node.children.setdefault(frame, Node(frame))
            node.value += weight
    return root


def _inclusive_paths(stacks: dict[tuple[str, ...], float]) -> dict[tuple[str, ...], float]:
    """Share of total weight under each path prefix."""
    total = sum(w for w in stacks.values() if w > 0)
    out: dict[tuple[str, ...], float] = {}
    if total <= 0:
        return out
    for stack, w in stacks.items():
        if w <= 0:
            continue
        for i in range(1, len(stack) + 1):
            out[stack[:i]] = out.get(stack[:i], 0.0) + w / total
    return out


def _warm(name: str) -> str:
    h = int(hashlib.blake2s(name.encode(), digest_size=4).hexdigest(), 16)
    return f"rgb({205 + h % 50},{(h >> 8) % 180 + 40},{(h >> 16) % 55})"


def _diff_colour(delta: float) -> str:
    # Full colour at a 10 percentage point change; white when unchanged.
    k = min(1.0, abs(delta) / 0.10)
    fade = int(255 * (1 - k))
    return f"rgb(255,{fade},{fade})" if delta > 0 else f"rgb({fade},{fade},255)"


def _render(root: Node, title: str, colour, subtitle: str = "") -> str:
    depth = _depth(root)
    height = PAD + (depth + 1) * ROW + 10
    total = root.value or 1.0
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" font-family="monospace" font-size="11">',
        f'<rect width="{WIDTH}" height="{height}" fill="#f8f8f8"/>',
        f'<text x="{WIDTH / 2}" y="16" text-anchor="middle" font-size="14">{escape(title)}</text>',
    ]
    if subtitle:
        parts.append(f'<text x="10" y="16" font-size="10">{escape(subtitle)}</text>')

    def walk(node: Node, path: tuple[str, ...], x: float, level: int) -> None:
        w = node.value / total * WIDTH
        if node.value / total < MIN_FRACTION:
            return
        y = height - 10 - (level + 1) * ROW  # root at the bottom, like flamegraph.pl
        label = f"{node.name} ({node.value / total * 100:.2f}%)"
        fill, extra = colour(path, node)
        parts.append(f'<g><title>{escape(label + extra)}</title>'
                     f'<rect x="{x:.2f}" y="{y}" width="{max(w - 0.5, 0.1):.2f}" height="{ROW - 1}" '
                     f'fill="{fill}" rx="1"/>')
        chars = int((w - 6) / 7)
        if chars >= 3:
            text = node.name if len(node.name) <= chars else node.name[: chars - 2] + ".."
            parts.append(f'<text x="{x + 3:.2f}" y="{y + 11}">{escape(text)}</text>')
        parts.append("</g>")
        cx = x
        for child in sorted(node.children.values(), key=lambda n: n.name):
            walk(child, (*path, child.name), cx, level + 1)
            cx += child.value / total * WIDTH

    walk(root, (), 0.0, 0)
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def _depth(node: Node) -> int:
    return 0 if not node.children else 1 + max(_depth(c) for c in node.children.values())


def render_svg(stacks: dict[tuple[str, ...], float], title: str = "scheduler profile") -> str:
    """Flamegraph of one profile."""
    root = build_tree(stacks)
    if root.value <= 0:
        return _render(Node("no samples"), title, lambda p, n: ("#ddd", ""))
    return _render(root, title, lambda path, node: ("#e0e0e0" if not path else _warm(node.name), ""))


def render_diff_svg(baseline: dict[tuple[str, ...], float], current: dict[tuple[str, ...], float],
                    title: str = "scheduler profile diff (red: grew, blue: shrank)") -> str:
    """Differential flamegraph: current's shape, coloured by inclusive-share change vs baseline."""
    base = _inclusive_paths(baseline)
    cur = _inclusive_paths(current)
    root = build_tree(current)
    if root.value <= 0:
        return _render(Node("no samples"), title, lambda p, n: ("#ddd", ""))

    def colour(path, node):
        if not path:
            return "#e0e0e0", ""
        delta = cur.get(path, 0.0) - base.get(path, 0.0)
        return _diff_colour(delta), f" {delta * 100:+.2f} pp vs baseline"

    gone = sum(v for p, v in base.items() if len(p) == 1 and p not in cur)
    sub = f"baseline-only roots: {gone * 100:.1f}%" if gone else ""
    return _render(root, title, colour, sub)


def to_speedscope(stacks: dict[tuple[str, ...], float], name: str = "scheduler", unit: str = "microseconds") -> dict:
    """speedscope's 'sampled' profile: one weighted sample per distinct stack."""
    frames: list[dict] = []
    index: dict[str, int] = {}
    samples, weights = [], []
    for stack, w in sorted(stacks.items(), key=lambda kv: -kv[1]):
        if w <= 0:
            continue
        ids = []
        for f in stack:
            if f not in index:
                index[f] = len(frames)
                fn, _, file = f.partition(" (")
                frames.append({"name": fn, "file": file.rstrip(")")} if file else {"name": fn})
            ids.append(index[f])
        samples.append(ids)
        weights.append(w)
    return {
        "$schema": "https://www.speedscope.app/file-format-schema.json",
        "shared": {"frames": frames},
        "profiles": [{"type": "sampled", "name": name, "unit": unit, "startValue": 0,
                      "endValue": sum(weights), "samples": samples, "weights": weights}],
        "name": name,
        "exporter": "vlm-sidecar",
    }
