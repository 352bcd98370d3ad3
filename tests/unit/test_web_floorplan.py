"""The floor plan's server side: image checks, scale, planar distances, plan positions; ping's argv."""

from __future__ import annotations

import asyncio
import base64
import struct
import zlib
from pathlib import Path
from typing import Any

import pytest

from dit.web.services import probe
from dit.web.services.floorplan import MAX_BYTES, decode_upload, image_size, plan_of, scale_from
from dit.web.services.nodes import Inventory, NodeError, check_node
from dit.web.services.topology import Point, distance_km, links, topology_delays


def png(width: int, height: int) -> bytes:
    """A real (grey) PNG of ``width`` by ``height`` pixels."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    raw = b"".join(b"\x00" + b"\xc8" * width for _ in range(height))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")
    )


def png_header(width: int, height: int) -> bytes:
    """A PNG that only declares its size: signature, IHDR, IEND (no pixels, a few bytes whatever the size)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    chunks = [(b"IHDR", ihdr), (b"IEND", b"")]
    body = b"".join(
        struct.pack(">I", len(d)) + k + d + struct.pack(">I", zlib.crc32(k + d)) for k, d in chunks
    )
    return b"\x89PNG\r\n\x1a\n" + body


def jpeg_header(width: int, height: int) -> bytes:
    """The start of a baseline JPEG: SOI, an APP0 segment, then SOF0 with the size."""
    app0 = b"\xff\xe0" + struct.pack(">H", 16) + b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"
    sof = b"\xff\xc0" + struct.pack(">HBHHB", 11, 8, height, width, 1) + b"\x01\x11\x00"
    return b"\xff\xd8" + app0 + sof + b"\xff\xd9"


def upload(data: bytes, kind: str = "image/png") -> dict[str, Any]:
    return {"content_type": kind, "data": base64.b64encode(data).decode()}


def test_image_size_reads_png_and_jpeg_headers() -> None:
    assert image_size(png(37, 21)) == ("image/png", 37, 21)
    assert image_size(jpeg_header(640, 480)) == ("image/jpeg", 640, 480)
    with pytest.raises(NodeError) as exc:
        image_size(b"GIF89a....")
    assert exc.value.field == "data"


def test_upload_accepts_a_png_and_a_data_url() -> None:
    data, suffix, width, height = decode_upload(upload(png(40, 30)))
    assert (suffix, width, height) == (".png", 40, 30) and data.startswith(b"\x89PNG")
    as_url = {"content_type": "image/png", "data": "data:image/png;base64," + upload(png(2, 2))["data"]}
    assert decode_upload(as_url)[2:] == (2, 2)


@pytest.mark.parametrize(
    ("body", "field", "status"),
    [
        (upload(png(4, 4), "image/svg+xml"), "content_type", 415),
        ({"data": upload(png(4, 4))["data"]}, "content_type", 415),
        (upload(png(4, 4), "image/jpeg"), "content_type", 415),  # declared JPEG, is a PNG
        ({"content_type": "image/png", "data": "%%% not base64"}, "data", 422),
        ({"content_type": "image/png", "data": ""}, "data", 422),
        (upload(b"<svg onload=alert(1)>"), "data", 422),
        (upload(png(4, 4)[:20]), "data", 422),
        ({"content_type": "image/png", "data": "A" * (MAX_BYTES // 3 * 4 + 400)}, "data", 413),
        (upload(jpeg_header(30_000, 10), "image/jpeg"), "data", 422),
        # within 20000 px a side, but 100 megapixels (400 MB of RGBA) for the browser to decode
        (upload(png_header(10_000, 10_000)), "data", 413),
        (upload(jpeg_header(8_000, 7_000), "image/jpeg"), "data", 413),
    ],
)
def test_upload_refusals_name_the_field(body: dict[str, Any], field: str, status: int) -> None:
    with pytest.raises(NodeError) as exc:
        decode_upload(body)
    assert (exc.value.field, exc.value.status) == (field, status)


def test_scale_from_two_points_and_their_distance() -> None:
    plan = {"width_px": 1000, "height_px": 700}
    scale = scale_from({"a": [100, 100], "b": [400, 500], "distance_m": 10}, plan)
    assert scale["metres_per_px"] == pytest.approx(10 / 500)  # 300-400-500 triangle
    for body, field in (
        ({"a": [1, 1], "b": [1, 1], "distance_m": 5}, "b"),
        ({"a": [1, 1], "b": [1200, 1], "distance_m": 5}, "b"),
        ({"a": "x", "b": [9, 9], "distance_m": 5}, "a"),
        ({"a": [1, 1], "b": [90, 1], "distance_m": 0}, "distance_m"),
        ({"a": [1, 1], "b": [90, 1], "distance_m": True}, "distance_m"),
    ):
        with pytest.raises(NodeError) as exc:
            scale_from(body, plan)
        assert exc.value.field == field


def test_plan_defaults_to_a_blank_sheet_without_scale() -> None:
    plan = plan_of({})
    assert (plan["image"], plan["width_px"], plan["height_px"], plan["metres_per_px"]) == (
        None,
        1000,
        700,
        None,
    )


def test_planar_distance_gives_the_map_delay_rule() -> None:
    edge = Point("edge", "edge", x_m=0.0, y_m=0.0)
    dev = Point("d1", "device", x_m=3.0, y_m=4.0)  # 5 m apart
    assert distance_km(edge, dev) == pytest.approx(0.005)
    assert links([edge, dev]) == [{"a": "d1", "b": "edge", "km": 0.005, "m": 5.0, "delay_ms": 5.005}]
    assert topology_delays([edge, dev]) == {"d1": {"edge": 5.005}}


def test_plan_positions_are_stored_beside_world_positions(tmp_path: Path) -> None:
    inv = Inventory(tmp_path / "inv.yml")
    with pytest.raises(NodeError) as exc:
        check_node({"name": "d1", "address": "10.0.0.1"}, require="plan")
    assert exc.value.field == "x"
    with pytest.raises(NodeError) as exc:
        check_node({"name": "d1", "address": "10.0.0.1", "x": -1, "y": 3}, require="plan")
    assert exc.value.field == "x"
    inv.upsert(check_node({"name": "d1", "address": "10.0.0.1", "lat": 38.0, "lon": 23.7}), create=True)
    moved = check_node({"name": "d1", "address": "10.0.0.1", "x": 12.5, "y": 40}, require="plan")
    node = inv.upsert(moved, create=False)
    assert (node.x, node.y, node.lat, node.lon) == (12.5, 40.0, 38.0, 23.7)
    plan_point = node.plan_point(0.5)
    assert plan_point is not None and (plan_point.x_m, plan_point.y_m) == (6.25, 20.0)
    inv.set_variable("dit_floorplan", {"width_px": 10, "height_px": 20})
    assert inv.variables()["dit_floorplan"] == {"width_px": 10, "height_px": 20}
    assert [n.name for n in inv.nodes()] == ["d1"]  # a group variable is not a host


def test_ping_sends_exactly_three_echo_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    """No ``-w`` deadline: with one, ping went on to 5 requests for an unreachable node (issue 16)."""
    seen: list[tuple[str, ...]] = []

    class Done:
        returncode = 1  # ping's status when nothing answered

        async def communicate(self) -> tuple[bytes, None]:
            return b"3 packets transmitted, 0 received, 100% packet loss, time 410ms\n", None

    async def fake_exec(*argv: str, **_: Any) -> Done:
        seen.append(argv)
        return Done()

    monkeypatch.setattr(asyncio, "create_subprocess_exec", fake_exec)
    result = asyncio.run(probe.ping(probe.Target("n", "192.0.2.1")))
    (argv,) = seen
    assert argv[0] == "ping" and argv[argv.index("-c") + 1] == "3"
    assert "-w" not in argv and "-i" in argv and argv[-1] == "192.0.2.1"
    assert result.to_json()["sent"] == 3 and "3 packets transmitted" in result.detail


def test_tiles_option_kinds_and_refusals(tmp_path: Path) -> None:
    from dit.web.routes.nodes import check_tiles, page_tiles

    assert check_tiles(None) is None and page_tiles(None) is None  # the floor plan
    online = "https://tile.example.org/{z}/{x}/{y}.png"
    assert check_tiles(online) is None and page_tiles(online) == online
    assert "lacks {y}" in str(check_tiles("https://tile.example.org/{z}/{x}.png"))
    assert check_tiles(str(tmp_path)) is None and page_tiles(str(tmp_path)) == "/tiles/{z}/{x}/{y}.png"
    assert "no MBTiles file" in str(check_tiles(str(tmp_path / "lab.mbtiles")))
    assert "tile directory" in str(check_tiles(str(tmp_path / "nowhere")))
