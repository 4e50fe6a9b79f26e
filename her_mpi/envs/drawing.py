"""Pillow helpers for the envs that draw their own frames (bit flipping, predator-prey) and for the
captions of policy videos: colours, fonts, the banner's height."""

from __future__ import annotations

SUCCESS_COLOR, FAILURE_COLOR = (80, 220, 100), (255, 90, 80)
_FONTS: dict = {}


def banner_height(height: int) -> int:
    """Rows at the top of a frame kept for its caption."""
    return max(12, height // 16)


def caption_font(size: int):
    from PIL import ImageFont

    if size not in _FONTS:
        try:
            _FONTS[size] = ImageFont.load_default(size=size)
        except (OSError, TypeError):  # Pillow without FreeType: the fixed bitmap font
            _FONTS[size] = ImageFont.load_default()
    return _FONTS[size]


def check_render_size(env_id: str, width, height) -> tuple[int, int]:
    for name, value in (("width", width), ("height", height)):
        if isinstance(value, bool) or not isinstance(value, int) or not 16 <= value <= 4096:
            raise ValueError(f"{env_id}: render {name} must be an integer in [16, 4096], got {value!r}")
    return width, height
