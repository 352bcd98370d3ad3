"""Nodes on the map (the NNPM-managed inventory), the floor plan, map tiles, and the topology between nodes.

The map is a floor plan (:mod:`dit.web.services.floorplan`) unless ``dit web --tiles`` configures a tile layer;
positions, links and delays are those of the view in use (``map_mode``).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import FileResponse, Response

from dit.web.routes.common import Context, Ctx, json_body
from dit.web.services import floorplan
from dit.web.services.nodes import Node, NodeError, check_node
from dit.web.services.topology import (
    RULE_VAR,
    DelayRule,
    Point,
    RuleError,
    links,
    rule_from,
    rule_of,
    topology_delays,
)

router = APIRouter()
LOCAL_TILES = "/tiles/{z}/{x}/{y}.png"


def tile_kind(tiles: str | None) -> str | None:
    """``url`` (an online template), ``dir`` (a local z/x/y.png tree), ``mbtiles`` (a file), or None."""
    if not tiles:
        return None
    if tiles.startswith(("http://", "https://")):
        return "url"
    return "mbtiles" if tiles.endswith(".mbtiles") else "dir"


def check_tiles(tiles: str | None) -> str | None:
    """Why ``--tiles`` cannot be used (None when it can): a URL template needs {z}, {x}, {y}."""
    kind = tile_kind(tiles)
    if kind is None or tiles is None:
        return None
    if kind == "url":
        missing = [p for p in ("{z}", "{x}", "{y}") if p not in tiles]
        return f"the URL template lacks {', '.join(missing)}" if missing else None
    path = Path(tiles)
    if kind == "mbtiles" and not path.is_file():
        return f"no MBTiles file at {tiles}"
    if kind == "dir" and not path.is_dir():
        return f"neither an http(s) URL template, an .mbtiles file nor a tile directory: {tiles}"
    return None


def page_tiles(tiles: str | None) -> str | None:
    """The tile URL template the page loads: the configured URL, or NNPM's own for local tiles."""
    kind = tile_kind(tiles)
    return None if kind is None else tiles if kind == "url" else LOCAL_TILES


def map_mode(ctx: Context) -> str:
    return "tiles" if tile_kind(ctx.config.tiles) else "plan"


def plan_json(ctx: Context) -> dict[str, Any]:
    plan = floorplan.plan_of(ctx.inventory.variables())
    stored = ctx.inventory.variables().get(floorplan.VAR) or {}
    version = stored.get("sha256", "")[:16] if isinstance(stored, dict) else ""
    plan["image_url"] = f"/api/floorplan/image?v={version}" if plan["image"] else None
    plan["editable"] = ctx.inventory.editable
    return plan


def map_points(ctx: Context, nodes: list[Node] | None = None) -> tuple[list[Point], dict[str, Any]]:
    """The nodes placed in the view in use, as topology points (none on an unscaled plan), and the view."""
    nodes = ctx.inventory.nodes() if nodes is None else nodes
    mode = map_mode(ctx)
    if mode == "tiles":
        return [p for p in (n.point for n in nodes) if p is not None], {"mode": mode, "plan": None}
    plan = plan_json(ctx)
    mpp = plan["metres_per_px"]
    if mpp is None:
        return [], {"mode": mode, "plan": plan}
    return [p for p in (n.plan_point(mpp) for n in nodes) if p is not None], {"mode": mode, "plan": plan}


def delay_rule(ctx: Context) -> DelayRule | None:
    """The distance rule the map's delays follow (the inventory's ``dit_delay_rule``), None for none."""
    return rule_of(ctx.inventory.variables())


def rule_json(rule: DelayRule | None) -> dict[str, Any]:
    return {"none": True, "text": "no distance rule"} if rule is None else rule.to_json()


@router.get("/api/nodes")
def get_nodes(ctx: Ctx) -> dict[str, Any]:
    nodes = ctx.inventory.nodes()
    points, view = map_points(ctx, nodes)
    rule = delay_rule(ctx)
    results = ctx.probe.results
    out = []
    for node in nodes:
        result = results.get(node.name)
        out.append({**node.to_json(), "probe": result.to_json() if result else None})
    return {
        "nodes": out,
        "links": links(points, rule),
        "delay_rule": rule_json(rule),
        "map": view,
        "editable": ctx.inventory.editable,
        "probe_method": ctx.probe.method,
    }


def checked(ctx: Context, data: dict[str, Any], name: str | None = None) -> dict[str, Any]:
    """``check_node`` with the position the view in use needs, inside the floor plan on a plan."""
    mode = map_mode(ctx)
    node = check_node(data, name, "plan" if mode == "plan" else "geo")
    if mode == "plan":
        plan = floorplan.plan_of(ctx.inventory.variables())
        for key, side in (("x", plan["width_px"]), ("y", plan["height_px"])):
            if node[key] > side:
                raise NodeError(key, f"must lie on the floor plan (0..{side} px)")
    return node


@router.post("/api/nodes", status_code=201)
async def add_node(ctx: Ctx, request: Request) -> dict[str, Any]:
    data = checked(ctx, await json_body(request))
    node = await asyncio.to_thread(ctx.inventory.upsert, data, True)
    return node.to_json()


@router.put("/api/nodes/{name}")
async def put_node(ctx: Ctx, name: str, request: Request) -> dict[str, Any]:
    data = checked(ctx, await json_body(request), name)
    node = await asyncio.to_thread(ctx.inventory.upsert, data, False)
    return node.to_json()


@router.patch("/api/nodes/{name}/position")
async def move_node(ctx: Ctx, name: str, request: Request) -> dict[str, Any]:
    """Move a node: ``{lat, lon}`` on a world map, ``{x, y}`` (image pixels) on the floor plan."""
    body = await json_body(request)
    current = next((n for n in ctx.inventory.nodes() if n.name == name), None)
    if current is None:
        raise NodeError("name", f"no node named {name}", 404)
    keys = ("x", "y") if map_mode(ctx) == "plan" else ("lat", "lon")
    data = checked(ctx, {**current.to_json(), **{k: body.get(k) for k in keys}}, name)
    node = await asyncio.to_thread(ctx.inventory.upsert, data, False)
    return node.to_json()


@router.delete("/api/nodes/{name}", status_code=204)
def delete_node(ctx: Ctx, name: str) -> Response:
    ctx.inventory.delete(name)
    return Response(status_code=204)


@router.get("/api/topology")
def get_topology(ctx: Ctx) -> dict[str, Any]:
    valid, view = map_points(ctx)
    rule = delay_rule(ctx)
    edge = next((p.name for p in valid if p.role == "edge"), None)
    return {
        "edge": edge,
        "mode": view["mode"],
        "links": links(valid, rule),
        "delays": topology_delays(valid, rule),
        "delay_rule": rule_json(rule),
    }


@router.put("/api/delay-rule")
async def put_delay_rule(ctx: Ctx, request: Request) -> dict[str, Any]:
    """``{base_ms, ms_per_m}`` (a link's delay: base + per-metre term of its distance) or ``{none: true}``
    (the map gives no delay): the rule the map's labels, the Links table and Apply map delays follow."""
    ctx.inventory.require_editable()
    body = await json_body(request)
    try:
        rule = rule_from(body)
    except RuleError as exc:
        raise NodeError(exc.field, exc.message) from None
    stored = {"none": True} if rule is None else {"base_ms": rule.base_ms, "ms_per_m": rule.ms_per_m}
    await asyncio.to_thread(ctx.inventory.set_variable, RULE_VAR, stored)
    return rule_json(rule)


# -- the floor plan ----------------------------------------------------------------------------------
@router.get("/api/floorplan")
def get_floorplan(ctx: Ctx) -> dict[str, Any]:
    return plan_json(ctx)


@router.put("/api/floorplan/image")
async def put_floorplan_image(ctx: Ctx, request: Request) -> dict[str, Any]:
    """``{content_type: image/png|image/jpeg, data: base64}``: the plan's image, beside the inventory.

    Node positions keep their place relative to the plan (scaled by the new size over the old one);
    the scale is kept for an image of the same shape (the same plan at another size), reset for another
    shape; ``upload`` says which, and how many nodes moved.
    """
    ctx.inventory.require_editable()
    data, suffix, width, height = floorplan.decode_upload(await json_body(request))

    def store() -> dict[str, Any]:
        target = ctx.inventory.beside(".floorplan" + suffix)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + ".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, target)
        for other in set(floorplan.TYPES.values()) - {suffix}:
            ctx.inventory.beside(".floorplan" + other).unlink(missing_ok=True)
        value: dict[str, Any] = {
            "image": target.name,
            "width_px": width,
            "height_px": height,
            "sha256": hashlib.sha256(data).hexdigest(),
        }
        fx, fy, scale, said = floorplan.rescaled(floorplan.plan_of(ctx.inventory.variables()), width, height)
        if scale:
            value["scale"] = scale
        moved = ctx.inventory.set_variable_rescaling_plan(floorplan.VAR, value, fx, fy)
        return {"moved": moved, "scale": "kept" if scale else "reset", "message": said}

    upload = await asyncio.to_thread(store)
    return {**plan_json(ctx), "upload": upload}


@router.get("/api/floorplan/image")
def get_floorplan_image(ctx: Ctx) -> FileResponse:
    plan = floorplan.plan_of(ctx.inventory.variables())
    files = (ctx.inventory.beside(".floorplan" + suffix) for suffix in floorplan.TYPES.values())
    path = next((p for p in files if p.name == plan["image"] and p.is_file()), None)
    if path is None:
        raise HTTPException(404, "no floor plan image")
    media = "image/png" if path.suffix == ".png" else "image/jpeg"
    return FileResponse(path, media_type=media, headers={"Cache-Control": "no-cache"})


@router.put("/api/floorplan/scale")
async def put_floorplan_scale(ctx: Ctx, request: Request) -> dict[str, Any]:
    """``{a: [x, y], b: [x, y], distance_m}``: two points on the plan (pixels) and their distance."""
    ctx.inventory.require_editable()
    body = await json_body(request)
    variables = ctx.inventory.variables()
    scale = floorplan.scale_from(body, floorplan.plan_of(variables))
    stored = variables.get(floorplan.VAR)
    value = dict(stored) if isinstance(stored, dict) else {}
    value["scale"] = scale
    value.setdefault("width_px", floorplan.DEFAULT_SIZE[0])
    value.setdefault("height_px", floorplan.DEFAULT_SIZE[1])
    await asyncio.to_thread(ctx.inventory.set_variable, floorplan.VAR, value)
    return plan_json(ctx)


# -- local tiles ---------------------------------------------------------------------------------------
@router.get("/tiles/{z}/{x}/{y}.png")
def get_tile(ctx: Ctx, z: int, x: int, y: int) -> Response:
    """A tile of a local tile directory (``z/x/y.png``) or MBTiles file (TMS rows), for offline maps."""
    tiles = ctx.config.tiles
    kind = tile_kind(tiles)
    if tiles is None or kind not in ("dir", "mbtiles") or not (0 <= z <= 30 and x >= 0 and y >= 0):
        raise HTTPException(404, "no local tiles")
    if kind == "dir":
        path = Path(tiles) / str(z) / str(x) / f"{y}.png"
        if not path.is_file():
            raise HTTPException(404, "no such tile")
        return FileResponse(path, media_type="image/png")
    with closing(sqlite3.connect(f"file:{tiles}?mode=ro", uri=True)) as db:
        row = db.execute(
            "SELECT tile_data FROM tiles WHERE zoom_level = ? AND tile_column = ? AND tile_row = ?",
            (z, x, (1 << z) - 1 - y),
        ).fetchone()
    if row is None:
        raise HTTPException(404, "no such tile")
    blob = bytes(row[0])
    return Response(blob, media_type="image/jpeg" if blob.startswith(b"\xff\xd8") else "image/png")
