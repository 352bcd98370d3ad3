"""The floor plan: an image of the room the testbed stands in, its scale, and nodes placed on it.

A lab rack needs no world map. Without a tile layer (``dit web`` without ``--tiles``) NNPM's map is a
floor plan: an uploaded PNG or JPEG (at most :data:`MAX_BYTES`, :data:`MAX_SIDE` pixels a side and
:data:`MAX_PIXELS` pixels, read from its header without decoding it), shown with Leaflet's simple CRS in
image pixels. Its scale comes from two points marked on it and the distance between them in metres;
node positions are image pixels (``x`` right, ``y`` down from the top-left corner), so a new scale
moves no node and changes every distance. Before an image is uploaded the plan is a blank sheet of
:data:`DEFAULT_SIZE` pixels, which can be scaled and used the same way.

Storage, with the inventory it describes: the image in a file beside the inventory
(``<stem>.floorplan.png|jpg``), its size and scale in the inventory variable ``dit_floorplan`` of
group ``all``, and each node's position in its host variables ``dit_plan_x`` / ``dit_plan_y``.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import math
import struct
from collections.abc import Mapping
from typing import Any

from dit.web.services.nodes import NodeError

MAX_BYTES = 8 * 1024 * 1024  # the largest image accepted
MAX_SIDE = 20_000  # pixels, either side
# what a browser is asked to decode: 8 MiB of PNG can declare 100 megapixels (400 MB of RGBA once decoded)
MAX_PIXELS = 50_000_000
DEFAULT_SIZE = (1000, 700)  # the blank sheet before an image is uploaded
TYPES = {"image/png": ".png", "image/jpeg": ".jpg"}
VAR = "dit_floorplan"
_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


def image_size(data: bytes) -> tuple[str, int, int]:
    """The type (``image/png`` | ``image/jpeg``) and pixel size of an image, read from its header.

    :class:`NodeError` on field ``data`` when it is neither a PNG nor a JPEG or its header is broken.
    """
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        if len(data) < 24 or data[12:16] != b"IHDR":
            raise NodeError("data", "a PNG without its IHDR header")
        width, height = struct.unpack(">II", data[16:24])
        return "image/png", int(width), int(height)
    if data.startswith(b"\xff\xd8"):
        pos = 2
        while pos + 4 <= len(data):
            if data[pos] != 0xFF:
                raise NodeError("data", "a JPEG with a broken marker")
            marker = data[pos + 1]
            if marker == 0xFF:  # fill byte
                pos += 1
                continue
            if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:
                pos += 2
                continue
            (length,) = struct.unpack(">H", data[pos + 2 : pos + 4])
            if marker in _SOF:
                if pos + 9 > len(data):
                    break
                height, width = struct.unpack(">HH", data[pos + 5 : pos + 9])
                return "image/jpeg", int(width), int(height)
            pos += 2 + length
        raise NodeError("data", "a JPEG without a frame header (no image size)")
    raise NodeError("data", "not a PNG or JPEG image")


def decode_upload(body: Mapping[str, Any]) -> tuple[bytes, str, int, int]:
    """An upload ``{content_type, data: base64}`` as ``(bytes, suffix, width, height)``, checked.

    The declared type must be PNG or JPEG and match the bytes; the image at most :data:`MAX_BYTES`,
    :data:`MAX_SIDE` pixels a side and :data:`MAX_PIXELS` pixels, as its header declares (nothing is
    decoded). Errors name the field (``content_type`` or ``data``).
    """
    declared = body.get("content_type")
    if declared not in TYPES:
        raise NodeError(
            "content_type", f"must be one of {', '.join(TYPES)} (got {str(declared)[:60]!r})", 415
        )
    text = body.get("data")
    if not isinstance(text, str) or not text:
        raise NodeError("data", "the image, base64-encoded")
    if text.startswith("data:"):  # a data: URL as FileReader gives it
        text = text.partition(",")[2]
    if len(text) > (MAX_BYTES + 2) // 3 * 4 + 4:
        raise NodeError("data", f"the image is larger than {MAX_BYTES // (1024 * 1024)} MiB", 413)
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise NodeError("data", "not valid base64") from None
    if len(data) > MAX_BYTES:
        raise NodeError("data", f"the image is larger than {MAX_BYTES // (1024 * 1024)} MiB", 413)
    kind, width, height = image_size(data)
    if kind != declared:
        raise NodeError("content_type", f"declared {declared} but the data is {kind}", 415)
    if not (1 <= width <= MAX_SIDE and 1 <= height <= MAX_SIDE):
        raise NodeError("data", f"{width} x {height} px: each side must be 1 to {MAX_SIDE} px")
    if width * height > MAX_PIXELS:
        raise NodeError(
            "data",
            f"{width} x {height} px is {width * height / 1e6:.1f} megapixels: at most "
            f"{MAX_PIXELS / 1e6:g} megapixels (a browser decodes every pixel); scale the plan down",
            413,
        )
    return data, TYPES[kind], width, height


def _point(value: Any, name: str, width: float, height: float) -> tuple[float, float]:
    if not isinstance(value, list | tuple) or len(value) != 2:
        raise NodeError(name, "a point [x, y] in image pixels")
    out: list[float] = []
    for v, side in zip(value, (width, height), strict=True):
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise NodeError(name, "a point [x, y] of numbers")
        if not 0 <= v <= side:
            raise NodeError(name, f"must lie on the floor plan (0..{width:g}, 0..{height:g} px)")
        out.append(round(float(v), 2))
    return out[0], out[1]


def scale_from(body: Mapping[str, Any], plan: Mapping[str, Any]) -> dict[str, Any]:
    """The scale ``{a, b, distance_m}`` of two marked points and their distance, with ``metres_per_px``."""
    width, height = float(plan["width_px"]), float(plan["height_px"])
    a = _point(body.get("a"), "a", width, height)
    b = _point(body.get("b"), "b", width, height)
    pixels = math.hypot(b[0] - a[0], b[1] - a[1])
    if pixels < 1:
        raise NodeError("b", "the two points must be at least 1 px apart")
    distance = body.get("distance_m")
    if isinstance(distance, bool) or not isinstance(distance, int | float) or not math.isfinite(distance):
        raise NodeError("distance_m", "a distance in metres")
    if not 0 < distance <= 100_000:
        raise NodeError("distance_m", "must lie in (0, 100000] m")
    return {
        "a": list(a),
        "b": list(b),
        "distance_m": float(distance),
        "metres_per_px": distance / pixels,
    }


def plan_of(variables: Mapping[str, Any]) -> dict[str, Any]:
    """The floor plan as the page sees it, from the inventory's ``dit_floorplan`` (blank sheet if none)."""
    raw = variables.get(VAR)
    raw = raw if isinstance(raw, Mapping) else {}
    width, height = DEFAULT_SIZE
    with contextlib.suppress(TypeError, ValueError):
        width, height = int(raw.get("width_px", width)), int(raw.get("height_px", height))
    scale = raw.get("scale") if isinstance(raw.get("scale"), Mapping) else None
    mpp = scale.get("metres_per_px") if scale else None
    ok = isinstance(mpp, int | float) and not isinstance(mpp, bool) and math.isfinite(mpp) and mpp > 0
    return {
        "image": raw.get("image") if isinstance(raw.get("image"), str) else None,
        "width_px": width,
        "height_px": height,
        "scale": dict(scale) if scale and ok else None,
        "metres_per_px": float(mpp) if ok and mpp is not None else None,
    }


def rescaled(
    plan: Mapping[str, Any], width: int, height: int
) -> tuple[float, float, dict[str, Any] | None, str]:
    """What a new image of ``width`` by ``height`` px does to ``plan`` (:func:`plan_of`): the factors
    node positions are multiplied by (they stay where they were, relative to the plan), the scale
    kept for it (the same shape: the same plan at another size; its points moved, its metres per pixel
    divided) or None, and a sentence saying which."""
    fx, fy = width / float(plan["width_px"]), height / float(plan["height_px"])
    scale = plan.get("scale")
    if not scale:
        return fx, fy, None, "no scale yet: mark two points and their distance"
    if abs(fx / fy - 1) > 0.01:
        return (
            fx,
            fy,
            None,
            (
                "the new image has another shape, so its scale is unknown: mark two points and their distance again"
            ),
        )
    try:
        kept = {
            "a": [round(float(scale["a"][0]) * fx, 2), round(float(scale["a"][1]) * fy, 2)],
            "b": [round(float(scale["b"][0]) * fx, 2), round(float(scale["b"][1]) * fy, 2)],
            "distance_m": float(scale["distance_m"]),
            "metres_per_px": float(plan["metres_per_px"]) / fx,
        }
    except (KeyError, IndexError, TypeError, ValueError):  # a hand-edited scale: marked again
        return fx, fy, None, "the old scale cannot be read: mark two points and their distance again"
    return fx, fy, kept, "the same shape: the scale is kept (the same plan at another size)"
