"""One check for the pictures the provider draws: a real PNG, decoded by Pillow, not blank."""

from __future__ import annotations

import io

from PIL import Image

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def decoded_png(png: bytes) -> Image.Image:
    """The PNG decoded; it must be a real, non-blank image (more than one distinct colour)."""
    assert png.startswith(PNG_SIGNATURE)
    image = Image.open(io.BytesIO(png))
    image.load()
    assert image.format == "PNG"
    colours = image.convert("RGB").getcolors(maxcolors=1 << 20)
    assert colours is not None
    assert len(colours) > 1, "the image is blank"
    return image
