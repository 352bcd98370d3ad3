"""``dit web``: NNPM, the web manager (the ``web`` extra)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from dit.commands.common import RunsRoot, fail, usable_runs_dir

if TYPE_CHECKING:
    pass


def web(
    host: Annotated[
        str, typer.Option(help="Address to bind; anything but loopback is reachable from the network.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 8765,
    inventory: Annotated[
        Path,
        typer.Option("-i", "--inventory", help="The NNPM-managed YAML inventory (created on first save)."),
    ] = Path("inventories/nnpm.yml"),
    runs_dir: RunsRoot = Path("runs"),
    scenarios_dir: Annotated[Path, typer.Option(help="Scenario YAML files offered in the dialogs.")] = Path(
        "scenarios"
    ),
    tiles: Annotated[
        str | None,
        typer.Option(
            help="A tile layer for a world map: an http(s) URL template ({z}/{x}/{y}), a local tile "
            "directory (z/x/y.png) or an .mbtiles file, served by NNPM. Without it the map is a floor plan."
        ),
    ] = None,
    tiles_attribution: Annotated[
        str, typer.Option(help="The credit shown with the tiles.")
    ] = "© OpenStreetMap contributors",
    probe: Annotated[str, typer.Option(help="Node probe: auto, ping, tcp (SSH port) or off.")] = "auto",
    no_token: Annotated[
        bool,
        typer.Option(
            "--no-token",
            help="Loopback only, for a single-user machine: no token, so every local user can drive NNPM "
            "with its rights (root, when run as root).",
        ),
    ] = False,
) -> None:
    """NNPM, the web manager: nodes on a map, scenario dialogs, runs, live terminal (FastAPI + uvicorn).

    Every request needs a token: a random one per start, printed in the URL to open, or the value of
    DIT_NNPM_TOKEN (an environment variable, not an option: other users can read a command line).
    """
    try:
        from dit.web.app import serve
        from dit.web.config import WebConfig
        from dit.web.security import TOKEN_ENV
    except ImportError as exc:
        raise fail(f"dit web needs the web extra: pip install 'dit[web]' ({exc})") from None
    if probe not in ("auto", "ping", "tcp", "off"):
        raise fail(f"--probe: {probe!r} is not one of auto, ping, tcp, off", 2)
    from dit.web.routes.nodes import check_tiles

    problem = check_tiles(tiles)
    if problem:
        raise fail(f"--tiles: {problem}", 2)
    config = WebConfig(
        host=host,
        port=port,
        inventory=inventory,
        runs_dir=runs_dir,
        scenarios_dir=scenarios_dir,
        tiles=tiles,
        tiles_attribution=tiles_attribution,
        probe=probe,
        token=os.environ.get(TOKEN_ENV),
        no_token=no_token,
    )
    try:
        config.ensure_token()
    except ValueError as exc:
        raise fail(str(exc), 2) from None
    usable_runs_dir(runs_dir, "--runs-dir")  # NNPM starts, stops and tags runs there as root
    serve(config)
