"""The floor plan over NNPM's API: the default view without tiles, upload checks, scale, positions, tiles."""

from __future__ import annotations

import base64
import sqlite3
from pathlib import Path

import pytest
import yaml
from fastapi.testclient import TestClient

from dit.web.app import WebConfig
from tests.integration.conftest import StartNnpm
from tests.unit.test_web_floorplan import jpeg_header, png, png_header


def config_for(tmp_path: Path, tiles: str | None = None) -> WebConfig:
    return WebConfig(inventory=tmp_path / "inv.yml", runs_dir=tmp_path / "runs", probe="off", tiles=tiles)


@pytest.fixture
def client(tmp_path: Path, nnpm: StartNnpm) -> TestClient:
    return nnpm(config_for(tmp_path))


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_without_tiles_the_map_is_a_floor_plan(client: TestClient) -> None:
    config = client.get("/api/config").json()
    assert config["tiles"] is None and config["tiles_attribution"] == ""  # no tiles, no credit
    view = client.get("/api/nodes").json()["map"]
    assert view["mode"] == "plan" and view["plan"]["image"] is None and view["plan"]["metres_per_px"] is None


def test_upload_scale_place_and_delays(client: TestClient, tmp_path: Path) -> None:
    image = png(800, 500)
    put = client.put("/api/floorplan/image", json={"content_type": "image/png", "data": b64(image)})
    assert put.status_code == 200, put.text
    assert (put.json()["image"], put.json()["width_px"], put.json()["height_px"]) == (
        "inv.floorplan.png",
        800,
        500,
    )
    assert (tmp_path / "inv.floorplan.png").read_bytes() == image  # beside the inventory
    got = client.get(put.json()["image_url"])
    assert got.status_code == 200 and got.headers["content-type"] == "image/png" and got.content == image
    node = {"name": "edge", "role": "edge", "address": "127.0.0.1", "x": 100, "y": 100}
    assert client.post("/api/nodes", json=node).status_code == 201
    assert (
        client.post(
            "/api/nodes", json={**node, "name": "d1", "role": "device", "x": 400, "y": 500}
        ).status_code
        == 201
    )
    outside = client.post("/api/nodes", json={**node, "name": "d2", "role": "device", "x": 801})
    assert outside.status_code == 422 and outside.json()["errors"][0]["path"] == "x"
    no_position = client.post("/api/nodes", json={"name": "d3", "address": "127.0.0.3", "lat": 1, "lon": 2})
    assert no_position.status_code == 422 and no_position.json()["errors"][0]["path"] == "x"
    assert client.get("/api/nodes").json()["links"] == []  # no scale yet: no distances
    scale = client.put("/api/floorplan/scale", json={"a": [0, 0], "b": [400, 0], "distance_m": 20})
    assert scale.status_code == 200 and scale.json()["metres_per_px"] == pytest.approx(0.05)
    (link,) = client.get("/api/nodes").json()["links"]
    assert link["m"] == pytest.approx(25.0) and link["delay_ms"] == pytest.approx(5.025)  # 300-400-500 px
    moved = client.patch("/api/nodes/d1/position", json={"x": 100, "y": 400})
    assert moved.status_code == 200 and moved.json()["y"] == 400
    assert client.get("/api/topology").json()["delays"] == {"d1": {"edge": pytest.approx(5.015)}}
    saved = yaml.safe_load((tmp_path / "inv.yml").read_text("utf-8"))
    assert saved["all"]["vars"]["dit_floorplan"]["scale"]["distance_m"] == 20
    assert saved["all"]["children"]["devices"]["hosts"]["d1"]["dit_plan_y"] == 400
    bad = client.put("/api/floorplan/scale", json={"a": [0, 0], "b": [400, 0], "distance_m": -3})
    assert bad.status_code == 422 and bad.json()["errors"][0]["path"] == "distance_m"
    # the same plan at half the size (issue 36 item 5): nodes keep their place on it, the scale is
    # kept with its metres per pixel doubled, so every distance and delay stays what it was
    half = client.put("/api/floorplan/image", json={"content_type": "image/png", "data": b64(png(400, 250))})
    assert half.json()["upload"] == {
        "moved": 2,
        "scale": "kept",
        "message": "the same shape: the scale is kept (the same plan at another size)",
    }
    assert half.json()["metres_per_px"] == pytest.approx(0.1)
    places = {n["name"]: (n["x"], n["y"]) for n in client.get("/api/nodes").json()["nodes"]}
    assert places == {"edge": (50, 50), "d1": (50, 200)}
    assert client.get("/api/topology").json()["delays"] == {"d1": {"edge": pytest.approx(5.015)}}
    # an image of another shape: positions still relative, the scale reset (it cannot be known), said so
    jpeg = jpeg_header(300, 200)
    again = client.put("/api/floorplan/image", json={"content_type": "image/jpeg", "data": b64(jpeg)})
    assert again.json()["image"] == "inv.floorplan.jpg" and again.json()["metres_per_px"] is None
    assert again.json()["upload"]["scale"] == "reset" and "another shape" in again.json()["upload"]["message"]
    places = {n["name"]: (n["x"], n["y"]) for n in client.get("/api/nodes").json()["nodes"]}
    assert places == {"edge": (37.5, 40), "d1": (37.5, 160)}
    assert not (tmp_path / "inv.floorplan.png").exists()


def test_upload_refusals_name_the_field_and_store_nothing(client: TestClient, tmp_path: Path) -> None:
    cases = [
        ({"content_type": "image/svg+xml", "data": b64(b"<svg/>")}, 415, "content_type"),
        ({"content_type": "image/png", "data": b64(b"<svg onload=alert(1)>")}, 422, "data"),
        ({"content_type": "image/png", "data": "A" * (12 * 1024 * 1024)}, 413, "data"),
    ]
    for body, status, field in cases:
        answer = client.put("/api/floorplan/image", json=body)
        assert answer.status_code == status and answer.json()["errors"][0]["path"] == field
    assert not (tmp_path / "inv.yml").exists() and list(tmp_path.glob("inv.floorplan.*")) == []
    assert client.get("/api/floorplan/image").status_code == 404


def test_an_image_declaring_more_pixels_than_a_browser_should_decode_is_refused(
    client: TestClient, tmp_path: Path
) -> None:
    # 100 megapixels declared in 45 bytes: read from the header, nothing decoded, refused naming the size
    answer = client.put(
        "/api/floorplan/image", json={"content_type": "image/png", "data": b64(png_header(10_000, 10_000))}
    )
    assert answer.status_code == 413, answer.text
    (error,) = answer.json()["errors"]
    assert error["path"] == "data" and "10000 x 10000 px is 100.0 megapixels" in error["message"]
    assert "at most 50 megapixels" in error["message"]
    assert (
        list(tmp_path.glob("inv.floorplan.*")) == [] and client.get("/api/floorplan/image").status_code == 404
    )
    # 50 megapixels exactly is a plan a browser can show
    fits = client.put(
        "/api/floorplan/image", json={"content_type": "image/png", "data": b64(png_header(10_000, 5_000))}
    )
    assert fits.status_code == 200, fits.text


def test_local_tiles_are_served_by_nnpm(tmp_path: Path, nnpm: StartNnpm) -> None:
    tiles = tmp_path / "tiles"
    (tiles / "3" / "4").mkdir(parents=True)
    (tiles / "3" / "4" / "2.png").write_bytes(png(2, 2))
    client = nnpm(config_for(tmp_path, str(tiles)))
    assert client.get("/api/config").json()["tiles"] == "/tiles/{z}/{x}/{y}.png"
    assert client.get("/api/nodes").json()["map"]["mode"] == "tiles"
    assert client.get("/tiles/3/4/2.png").content == png(2, 2)
    assert client.get("/tiles/3/4/3.png").status_code == 404
    mbtiles = tmp_path / "t.mbtiles"
    with sqlite3.connect(mbtiles) as db:
        db.execute("CREATE TABLE tiles (zoom_level INT, tile_column INT, tile_row INT, tile_data BLOB)")
        db.execute("INSERT INTO tiles VALUES (3, 4, 5, ?)", (png(3, 3),))  # TMS row 5 = XYZ row 7 - 5 = 2
    client = nnpm(config_for(tmp_path, str(mbtiles)))
    assert client.get("/tiles/3/4/2.png").content == png(3, 3)
    assert client.get("/tiles/3/4/5.png").status_code == 404


def test_the_distance_rule_is_the_researchers_to_set(client: TestClient, tmp_path: Path) -> None:
    """Issue 49 item 5: 5 ms + 1 ms/km gives every link in a room ~5.00 ms; the researcher sets the
    rule's base and per-metre terms (stored with the inventory), or none (the map then gives no delay)."""
    assert (
        client.put("/api/floorplan/scale", json={"a": [0, 0], "b": [400, 0], "distance_m": 20}).status_code
        == 200
    )
    node = {"name": "edge", "role": "edge", "address": "127.0.0.1", "x": 100, "y": 100}
    assert client.post("/api/nodes", json=node).status_code == 201
    assert (
        client.post("/api/nodes", json={**node, "name": "d1", "role": "device", "y": 300}).status_code == 201
    )
    nodes = client.get("/api/nodes").json()
    assert nodes["delay_rule"]["text"] == "5 ms + 1 ms/km" and nodes["links"][0]["delay_ms"] == pytest.approx(
        5.01
    )
    rule = client.put("/api/delay-rule", json={"base_ms": 0.2, "ms_per_m": 0.05})
    assert rule.status_code == 200, rule.text
    assert rule.json()["text"] == "0.2 ms + 0.05 ms/m"
    assert client.get("/api/nodes").json()["links"][0]["delay_ms"] == pytest.approx(0.7)  # 0.2 + 10 m x 0.05
    assert client.get("/api/topology").json()["delays"] == {"d1": {"edge": pytest.approx(0.7)}}
    saved = yaml.safe_load((tmp_path / "inv.yml").read_text("utf-8"))
    assert saved["all"]["vars"]["dit_delay_rule"] == {"base_ms": 0.2, "ms_per_m": 0.05}
    doc = {"name": "s", "devices": ["d1"]}
    applied = client.post("/api/scenarios/topology", json={"document": doc}).json()
    assert applied["document"]["network"] == {
        "d1": {"destinations": {"edge": {"delay_ms": pytest.approx(0.7)}}}
    }
    bad = client.put("/api/delay-rule", json={"base_ms": -1, "ms_per_m": 0.05})
    assert bad.status_code == 422 and bad.json()["errors"][0]["path"] == "base_ms"
    assert "[0, 10000]" in bad.json()["errors"][0]["message"]
    missing = client.put("/api/delay-rule", json={"base_ms": 1})
    assert missing.status_code == 422 and missing.json()["errors"][0]["path"] == "ms_per_m"
    none = client.put("/api/delay-rule", json={"none": True})
    assert none.status_code == 200 and none.json() == {"none": True, "text": "no distance rule"}
    assert client.get("/api/nodes").json()["links"][0]["delay_ms"] is None
    applied = client.post("/api/scenarios/topology", json={"document": doc}).json()
    assert "network" not in applied["document"] and applied["links"] == [] and applied["not_on_map"] == []
