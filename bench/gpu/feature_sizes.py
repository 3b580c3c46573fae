"""Image-feature sizes for the GPU benchmarks: pixels -> Qwen2.5-VL tokens -> bytes.

Qwen2.5-VL resizes an image so both sides are multiples of 28 (14-pixel patches merged 2x2),
keeping the pixel count inside [4*28*28, 16384*28*28] (SGLang's `smart_resize` in
`srt/multimodal/processors/qwen_vl.py`). Each 28x28 block becomes one LLM token whose embedding is
`hidden_size` wide; Qwen2.5-VL-3B has hidden size 2048, and SGLang keeps it in bf16 (2 bytes).
The benchmark ships features of that size: `tokens * 2048 * 2` bytes (4 KiB a token).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

PATCH_FACTOR = 28
MIN_PIXELS = 4 * 28 * 28
MAX_PIXELS = 16384 * 28 * 28
HIDDEN_SIZE_3B = 2048
BF16_BYTES = 2


def smart_resize(height: int, width: int, factor: int = PATCH_FACTOR,
                 min_pixels: int = MIN_PIXELS, max_pixels: int = MAX_PIXELS) -> tuple[int, int]:
    """Same rounding as SGLang's/Qwen's `smart_resize` (aspect-ratio check left out)."""
    h_bar = max(factor, round(height / factor) * factor)
    w_bar = max(factor, round(width / factor) * factor)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = math.floor(height / beta / factor) * factor
        w_bar = math.floor(width / beta / factor) * factor
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def image_tokens(height: int, width: int) -> int:
    """LLM tokens one image becomes after 2x2 patch merging."""
    h_bar, w_bar = smart_resize(height, width)
    return (h_bar // PATCH_FACTOR) * (w_bar // PATCH_FACTOR)


def feature_bytes(tokens: int, hidden_size: int = HIDDEN_SIZE_3B, dtype_bytes: int = BF16_BYTES) -> int:
    return tokens * hidden_size * dtype_bytes


@dataclass(frozen=True)
class Scenario:
    """One benchmark cell: `n_images` images of one resolution in a request."""

    resolution: str
    height: int
    width: int
    n_images: int

    @property
    def tokens(self) -> int:
        return image_tokens(self.height, self.width)

    @property
    def feature_bytes(self) -> int:
        return feature_bytes(self.tokens)


RESOLUTIONS = {"720p": (720, 1280), "1080p": (1080, 1920)}
IMAGE_COUNTS = (1, 3, 8)


def build_scenarios(resolutions: dict[str, tuple[int, int]] = RESOLUTIONS,
                    image_counts: tuple[int, ...] = IMAGE_COUNTS) -> list[Scenario]:
    return [Scenario(name, h, w, n) for name, (h, w) in resolutions.items() for n in image_counts]
