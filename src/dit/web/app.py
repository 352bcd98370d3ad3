"""The NNPM application: the routers of :mod:`dit.web.routes` over the testbed's own code, the page.

The security rules (token, loopback, Origin, body size and type) are :mod:`dit.web.security`'s middleware.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles

from dit.analysis.delay import OBJECTIVES
from dit.web.config import WebConfig
from dit.web.routes import nodes as nodes_routes
from dit.web.routes import runs as runs_routes
from dit.web.routes import runtimes as runtimes_routes
from dit.web.routes import scenarios as scenarios_routes
from dit.web.routes.common import Context, Ctx
from dit.web.security import Guard
from dit.web.services import floorplan
from dit.web.services import queue as run_queue
from dit.web.services import runs as runs_mod
from dit.web.services.nodes import Inventory, Node, NodeError
from dit.web.services.probe import ProbeLoop, Target
from dit.web.services.runtimes import Actions
from dit.web.services.store import Store, Version

STATIC = Path(__file__).resolve().parent / "static"
# twice the largest floor-plan image: room for its base64 (4/3 of it) and the JSON around it; no other
# body comes near
MAX_BODY_BYTES = 2 * floorplan.MAX_BYTES


def leaflet_dir() -> str:
    """Leaflet's files, from the ``xstatic-leaflet`` package (served locally; no CDN)."""
    module = importlib.import_module("xstatic.pkg.leaflet")
    return str(module.BASE_DIR)


def create_app(config: WebConfig) -> FastAPI:
    """The NNPM application for ``config`` (the token, when exposed, is generated here if missing)."""
    token = config.ensure_token()
    runs_root = config.runs_dir.resolve()  # run directories are absolute (RunDir)
    base = runs_mod.nnpm_dir(runs_root)
    inventory = Inventory(config.inventory)

    def nodes_or_none() -> list[Node]:
        try:
            return inventory.nodes()
        except NodeError:
            return []

    def probe_targets() -> list[Target]:
        try:
            nodes = inventory.nodes()
        except NodeError:
            return []
        return [Target(n.name, n.address, int(n.hostvars.get("ansible_port") or 22)) for n in nodes]

    ctx = Context(
        config=config,
        token=token,
        runs_root=runs_root,
        store=Store(config.db or base / "nnpm.sqlite"),
        inventory=inventory,
        probe=ProbeLoop(probe_targets, config.probe),
        actions=Actions(base, lambda: config.inventory if config.inventory.exists() else None, nodes_or_none),
    )

    def start_queued(version: Version, kind: str, mode: str) -> runs_mod.Launch:
        return runs_mod.launch(version, kind, mode, runs_root, config.inventory.resolve(), ctx.store)

    async def housekeeping() -> None:
        while True:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(runs_mod.tag_runs, runs_root, ctx.store)
                runs_mod.reap_children()
                await asyncio.to_thread(run_queue.advance, runs_root, ctx.store, start_queued)
            await asyncio.sleep(0.5)

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        ctx.probe.start()
        task = asyncio.get_running_loop().create_task(housekeeping())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await ctx.probe.stop()

    app = FastAPI(title="NNPM", lifespan=lifespan, docs_url="/api/docs", openapi_url="/api/openapi.json")
    app.state.ctx = ctx
    app.add_middleware(
        Guard,
        token=token,
        loopback=not config.exposed,
        port=config.port,
        max_body_bytes=MAX_BODY_BYTES,
        tiles=nodes_routes.page_tiles(config.tiles),
    )
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    app.mount("/vendor/leaflet", StaticFiles(directory=leaflet_dir()), name="leaflet")
    app.add_exception_handler(NodeError, node_error)  # type: ignore[arg-type]
    app.add_api_route("/", index, methods=["GET"], include_in_schema=False)
    app.add_api_route("/favicon.ico", favicon, methods=["GET"], include_in_schema=False)
    app.add_api_route("/api/config", get_config, methods=["GET"])
    for router in (nodes_routes.router, scenarios_routes.router, runs_routes.router, runtimes_routes.router):
        app.include_router(router)
    return app


async def node_error(_request: Request, exc: NodeError) -> JSONResponse:
    errors = [{"path": field, "message": message} for field, message in exc.problems]
    return JSONResponse({"detail": str(exc), "errors": errors}, status_code=exc.status)


async def index() -> FileResponse:
    return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-store"})


async def favicon() -> Response:
    return Response(status_code=204)


def get_config(ctx: Ctx) -> dict[str, Any]:
    """What the page needs to know about the server (map tiles, inventory, optimisers, token)."""
    from dit.optimise.registry import available

    config = ctx.config
    return {
        "tiles": nodes_routes.page_tiles(config.tiles),  # None: the floor plan
        "tiles_attribution": config.tiles_attribution if config.tiles else "",
        "map_center": list(config.map_center),
        "probe": {"requested": config.probe, "method": ctx.probe.method, "interval_s": ctx.probe.interval_s},
        "inventory": str(config.inventory),
        "inventory_editable": ctx.inventory.editable,
        "runs_dir": str(ctx.runs_root),
        "scenarios_dir": str(config.scenarios_dir),
        "algorithms": sorted(available()),
        "objectives": list(OBJECTIVES),
        "policies": ["RR", "SJF"],
        "token_required": ctx.token is not None,
    }


def what_no_token_gives_up() -> str:
    """The one line ``--no-token`` prints: who can then drive NNPM, with whose rights."""
    rights = (
        "as root, since it runs as root" if os.geteuid() == 0 else f"with the rights of uid {os.geteuid()}"
    )
    return (
        "NNPM: --no-token: any local user of this machine can drive NNPM (start runs, runtime actions, "
        f"edit the inventory) {rights}"
    )


def serve(config: WebConfig) -> None:
    """Run NNPM with uvicorn until interrupted; prints the address with the token (or what --no-token gives up).

    :class:`ValueError` (from :meth:`WebConfig.ensure_token`) before anything starts.
    """
    import uvicorn

    token = config.ensure_token()
    app = create_app(config)
    host = f"[{config.host}]" if ":" in config.host and not config.host.startswith("[") else config.host
    where = f"http://{host}:{config.port}/"
    print(f"NNPM: {where}" + (f"?token={token}" if token else ""), flush=True)
    if token is None:
        print(what_no_token_gives_up(), file=sys.stderr, flush=True)
    elif config.exposed:
        print(
            f"NNPM: bound to {config.host}: reachable from the network; every request needs the token",
            flush=True,
        )
    uvicorn.run(app, host=config.host, port=config.port, log_level="warning", ws="websockets-sansio")
