"""Nodes on the map (the NNPM-managed inventory) and the topology drawn between them."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from dit.web.nodes import NodeError, check_node
from dit.web.routes.common import Ctx, json_body
from dit.web.topology import links, topology_delays

router = APIRouter(prefix="/api")


@router.get("/nodes")
def get_nodes(ctx: Ctx) -> dict[str, Any]:
    nodes = ctx.inventory.nodes()
    points = [n.point for n in nodes if n.point is not None]
    results = ctx.probe.results
    out = []
    for node in nodes:
        result = results.get(node.name)
        out.append({**node.to_json(), "probe": result.to_json() if result else None})
    return {
        "nodes": out,
        "links": links(p for p in points if p is not None),
        "editable": ctx.inventory.editable,
        "probe_method": ctx.probe.method,
    }


@router.post("/nodes", status_code=201)
async def add_node(ctx: Ctx, request: Request) -> dict[str, Any]:
    data = check_node(await json_body(request))
    node = await asyncio.to_thread(ctx.inventory.upsert, data, True)
    return node.to_json()


@router.put("/nodes/{name}")
async def put_node(ctx: Ctx, name: str, request: Request) -> dict[str, Any]:
    data = check_node(await json_body(request), name)
    node = await asyncio.to_thread(ctx.inventory.upsert, data, False)
    return node.to_json()


@router.patch("/nodes/{name}/position")
async def move_node(ctx: Ctx, name: str, request: Request) -> dict[str, Any]:
    body = await json_body(request)
    current = next((n for n in ctx.inventory.nodes() if n.name == name), None)
    if current is None:
        raise NodeError("name", f"no node named {name}", 404)
    data = check_node({**current.to_json(), "lat": body.get("lat"), "lon": body.get("lon")}, name)
    node = await asyncio.to_thread(ctx.inventory.upsert, data, False)
    return node.to_json()


@router.delete("/nodes/{name}", status_code=204)
def delete_node(ctx: Ctx, name: str) -> Response:
    ctx.inventory.delete(name)
    return Response(status_code=204)


@router.get("/topology")
def get_topology(ctx: Ctx) -> dict[str, Any]:
    points = [n.point for n in ctx.inventory.nodes() if n.point is not None]
    valid = [p for p in points if p is not None]
    edge = next((p.name for p in valid if p.role == "edge"), None)
    return {"edge": edge, "links": links(valid), "delays": topology_delays(valid)}
