"""The NNPM application: FastAPI routes over the testbed's own code, and the static page.

Security: bound to a loopback address, NNPM needs no token but answers only requests whose ``Host``
is a loopback name (so a web page cannot reach it through DNS rebinding) and state-changing requests
must be JSON (so a cross-site form cannot post to it). Bound to anything else, every request and
WebSocket needs the token printed at start: ``X-NNPM-Token`` / ``Authorization: Bearer`` header,
``?token=`` query parameter (the page is opened as ``/?token=…`` and then keeps it in a cookie) or
the ``nnpm_token`` cookie; without it the answer is 401 (a WebSocket is closed with code 4401).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import importlib
import json
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from fastapi import FastAPI, HTTPException, Query, Request, WebSocket
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse, Response
from fastapi.staticfiles import StaticFiles

from dit.rundir import RunDir
from dit.scenario import FieldError, ScenarioError, expand, load_schema, load_yaml, validate
from dit.web import runs as runs_mod
from dit.web.nodes import Inventory, NodeError, check_node
from dit.web.probe import ProbeLoop, Target
from dit.web.runtimes import ACTIONS, CHECKS, Actions
from dit.web.store import Store, diff, version_hash
from dit.web.terminal import tail
from dit.web.topology import links, network_block, topology_delays

STATIC = Path(__file__).resolve().parent / "static"
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")
TOKEN_HEADER = "x-nnpm-token"  # noqa: S105 - a header name, not a secret
TOKEN_COOKIE = "nnpm_token"  # noqa: S105 - a cookie name
DEFAULT_TILES = "https://tile.openstreetmap.org/{z}/{x}/{y}.png"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


@dataclass
class WebConfig:
    host: str = "127.0.0.1"
    port: int = 8765
    inventory: Path = Path("inventories/nnpm.yml")
    runs_dir: Path = Path("runs")
    scenarios_dir: Path = Path("scenarios")
    tiles: str = DEFAULT_TILES
    tiles_attribution: str = "© OpenStreetMap contributors"
    probe: str = "auto"
    db: Path | None = None  # default: <runs_dir>/.nnpm/nnpm.sqlite
    token: str | None = None  # required when host is not loopback
    map_center: tuple[float, float] = (37.9838, 23.7275)  # Athens
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def exposed(self) -> bool:
        return self.host not in LOOPBACK_HOSTS and not self.host.startswith("127.")

    def ensure_token(self) -> str | None:
        if self.exposed and not self.token:
            self.token = secrets.token_urlsafe(24)
        return self.token


def _host_name(raw: str) -> str:
    if raw.startswith("["):
        return raw[: raw.find("]") + 1] if "]" in raw else raw
    return raw.rsplit(":", 1)[0] if raw.count(":") == 1 else raw


class Guard:
    """ASGI middleware: the token when exposed; loopback Host and JSON bodies when not."""

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app = app
        self.token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        set_cookie = False
        if self.token is not None:
            presented = headers.get(TOKEN_HEADER) or ""
            auth = headers.get("authorization", "")
            if not presented and auth.lower().startswith("bearer "):
                presented = auth[7:].strip()
            if not presented and query.get("token"):
                presented = query["token"][0]
                set_cookie = scope["type"] == "http"
            if not presented and "cookie" in headers:
                cookie: SimpleCookie = SimpleCookie()
                with contextlib.suppress(Exception):
                    cookie.load(headers["cookie"])
                if TOKEN_COOKIE in cookie:
                    presented = cookie[TOKEN_COOKIE].value
            if not hmac.compare_digest(presented.encode(), self.token.encode()):
                await self._refuse(
                    scope, send, 401, "a valid NNPM token is required (printed by dit web at start)"
                )
                return
        else:
            if _host_name(headers.get("host", "")) not in LOOPBACK_HOSTS:
                await self._refuse(scope, send, 403, "NNPM answers on its loopback address only")
                return
            method = scope.get("method", "GET")
            if scope["type"] == "http" and method in ("POST", "PUT", "PATCH", "DELETE"):
                ctype = headers.get("content-type", "")
                if headers.get("content-length", "0") != "0" and not ctype.startswith("application/json"):
                    await self._refuse(scope, send, 415, "requests must be JSON")
                    return
        if not set_cookie:
            await self.app(scope, receive, send)
            return
        token = self.token or ""

        async def send_with_cookie(message: Message) -> None:
            if message["type"] == "http.response.start":
                value = f"{TOKEN_COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict"
                message["headers"] = [*message.get("headers", []), (b"set-cookie", value.encode("latin-1"))]
            await send(message)

        await self.app(scope, receive, send_with_cookie)

    @staticmethod
    async def _refuse(scope: Scope, send: Send, status: int, detail: str) -> None:
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 4000 + status, "reason": detail})
            return
        body = json.dumps({"detail": detail}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


def leaflet_dir() -> str:
    """Leaflet's files, from the ``xstatic-leaflet`` package (served locally; no CDN)."""
    module = importlib.import_module("xstatic.pkg.leaflet")
    return str(module.BASE_DIR)


def field_errors(errors: list[FieldError]) -> list[dict[str, str]]:
    return [{"path": e.path, "message": e.message} for e in errors]


def _unprocessable(errors: list[dict[str, str]]) -> JSONResponse:
    return JSONResponse({"detail": "invalid", "errors": errors}, status_code=422)


async def _json(request: Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError:
        raise HTTPException(400, "the body is not JSON") from None
    if not isinstance(body, dict):
        raise HTTPException(400, "the body must be a JSON object")
    return body


def create_app(config: WebConfig) -> FastAPI:
    """The NNPM application for ``config`` (the token, when exposed, is generated here if missing)."""
    token = config.ensure_token()
    runs_root = config.runs_dir.resolve()  # run directories are absolute (RunDir)
    base = runs_mod.nnpm_dir(runs_root)
    store = Store(config.db or base / "nnpm.sqlite")
    inventory = Inventory(config.inventory)
    actions = Actions(base, lambda: config.inventory if config.inventory.exists() else None)

    def probe_targets() -> list[Target]:
        try:
            nodes = inventory.nodes()
        except NodeError:
            return []
        return [Target(n.name, n.address, int(n.hostvars.get("ansible_port") or 22)) for n in nodes]

    probe = ProbeLoop(probe_targets, config.probe)

    async def housekeeping() -> None:
        while True:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(runs_mod.tag_runs, runs_root, store)
                runs_mod.reap_children()
            await asyncio.sleep(0.5)

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        probe.start()
        task = asyncio.get_running_loop().create_task(housekeeping())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await probe.stop()

    app = FastAPI(title="NNPM", lifespan=lifespan, docs_url="/api/docs", openapi_url="/api/openapi.json")
    app.state.config = config
    app.state.store = store
    app.state.probe = probe
    app.state.actions = actions
    app.add_middleware(Guard, token=token)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    app.mount("/vendor/leaflet", StaticFiles(directory=leaflet_dir()), name="leaflet")

    @app.exception_handler(NodeError)
    async def node_error(_request: Request, exc: NodeError) -> JSONResponse:
        errors = [{"path": exc.field, "message": str(exc)}]
        return JSONResponse({"detail": str(exc), "errors": errors}, status_code=exc.status)

    @app.get("/", include_in_schema=False)
    async def index() -> FileResponse:
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-store"})

    @app.get("/favicon.ico", include_in_schema=False)
    async def favicon() -> Response:
        return Response(status_code=204)

    # -- meta ---------------------------------------------------------------------------------
    @app.get("/api/config")
    def get_config() -> dict[str, Any]:
        from dit.optimise.registry import available

        return {
            "tiles": config.tiles,
            "tiles_attribution": config.tiles_attribution,
            "map_center": list(config.map_center),
            "probe": {"requested": config.probe, "method": probe.method, "interval_s": probe.interval_s},
            "inventory": str(config.inventory),
            "inventory_editable": inventory.editable,
            "runs_dir": str(runs_root),
            "scenarios_dir": str(config.scenarios_dir),
            "algorithms": sorted(available()),
            "objectives": ["total_delay", "variance"],
            "policies": ["RR", "SJF"],
            "token_required": token is not None,
        }

    # -- nodes and topology -------------------------------------------------------------------
    def nodes_payload() -> dict[str, Any]:
        nodes = inventory.nodes()
        points = [n.point for n in nodes if n.point is not None]
        results = probe.results
        out = []
        for node in nodes:
            result = results.get(node.name)
            out.append({**node.to_json(), "probe": result.to_json() if result else None})
        return {
            "nodes": out,
            "links": links(p for p in points if p is not None),
            "editable": inventory.editable,
            "probe_method": probe.method,
        }

    @app.get("/api/nodes")
    def get_nodes() -> dict[str, Any]:
        return nodes_payload()

    @app.post("/api/nodes", status_code=201)
    async def add_node(request: Request) -> dict[str, Any]:
        data = check_node(await _json(request))
        node = await asyncio.to_thread(inventory.upsert, data, True)
        return node.to_json()

    @app.put("/api/nodes/{name}")
    async def put_node(name: str, request: Request) -> dict[str, Any]:
        data = check_node(await _json(request), name)
        node = await asyncio.to_thread(inventory.upsert, data, False)
        return node.to_json()

    @app.patch("/api/nodes/{name}/position")
    async def move_node(name: str, request: Request) -> dict[str, Any]:
        body = await _json(request)
        current = next((n for n in inventory.nodes() if n.name == name), None)
        if current is None:
            raise NodeError("name", f"no node named {name}", 404)
        data = check_node({**current.to_json(), "lat": body.get("lat"), "lon": body.get("lon")}, name)
        node = await asyncio.to_thread(inventory.upsert, data, False)
        return node.to_json()

    @app.delete("/api/nodes/{name}", status_code=204)
    def delete_node(name: str) -> Response:
        inventory.delete(name)
        return Response(status_code=204)

    @app.get("/api/topology")
    def get_topology() -> dict[str, Any]:
        points = [n.point for n in inventory.nodes() if n.point is not None]
        valid = [p for p in points if p is not None]
        edge = next((p.name for p in valid if p.role == "edge"), None)
        return {"edge": edge, "links": links(valid), "delays": topology_delays(valid)}

    # -- scenarios ----------------------------------------------------------------------------
    @app.get("/api/schema")
    def get_schema() -> dict[str, Any]:
        return load_schema()

    def scenario_files() -> list[dict[str, Any]]:
        folder = config.scenarios_dir
        if not folder.is_dir():
            return []
        return [{"file": p.name, "name": p.stem} for p in sorted(folder.glob("*.yaml")) if p.is_file()]

    @app.get("/api/scenarios")
    def get_scenarios() -> dict[str, Any]:
        return {"stored": store.names(), "files": scenario_files()}

    @app.get("/api/scenarios/files/{file}", response_model=None)
    def get_scenario_file(file: str) -> dict[str, Any] | JSONResponse:
        if file not in {f["file"] for f in scenario_files()}:
            raise HTTPException(404, f"no scenario file {file}")
        try:
            document = load_yaml(config.scenarios_dir / file)
        except ScenarioError as exc:
            return _unprocessable(field_errors(exc.errors))
        return {"file": file, "document": document}

    def check_document(body: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, str]]]:
        document = body.get("document")
        if "yaml" in body and document is None:
            try:
                document = load_yaml(str(body["yaml"]))
            except ScenarioError as exc:
                return {}, field_errors(exc.errors)
        if not isinstance(document, dict):
            return {}, [{"path": "", "message": "the scenario must be a mapping"}]
        return document, field_errors(validate(document))

    @app.post("/api/scenarios/validate")
    async def validate_scenario(request: Request) -> dict[str, Any]:
        document, errors = check_document(await _json(request))
        result: dict[str, Any] = {"valid": not errors, "errors": errors}
        if not errors:
            result["hash"] = version_hash(document)
            result["variants"] = [{"label": v.label, "hash": v.hash} for v in expand(document)]
        return result

    @app.post("/api/scenarios", status_code=201, response_model=None)
    async def save_scenario(request: Request) -> dict[str, Any] | JSONResponse:
        document, errors = check_document(await _json(request))
        if errors:
            return _unprocessable(errors)
        version, created = await asyncio.to_thread(store.save, document, expand(document))
        return {"version": version.to_json(), "created": created}

    @app.post("/api/scenarios/topology", response_model=None)
    async def apply_topology(request: Request) -> dict[str, Any] | JSONResponse:
        """The document with the map's per-destination delays merged into its ``network`` block."""
        body = await _json(request)
        document = body.get("document")
        if not isinstance(document, dict):
            return _unprocessable([{"path": "", "message": "the scenario must be a mapping"}])
        devices = [d for d in document.get("devices") or [] if isinstance(d, str)]
        valid = [p for p in (n.point for n in inventory.nodes()) if p is not None]
        edge = next((p.name for p in valid if p.role == "edge"), None)
        delays = topology_delays(valid)
        missing = [d for d in devices if d not in delays]
        network = network_block(
            delays, devices, edge, bool(body.get("device_links")), document.get("network") or {}
        )
        out = dict(document)
        if network:
            out["network"] = network
        return {"document": out, "edge": edge, "delays": delays, "not_on_map": missing}

    @app.get("/api/scenarios/{name}/versions")
    def get_history(name: str) -> dict[str, Any]:
        return {"name": name, "versions": [v.summary() for v in store.history(name)]}

    def version_or_404(digest: str) -> Any:
        version = store.find(digest)
        if version is None:
            raise HTTPException(404, f"no version {digest}")
        return version

    @app.get("/api/versions/{digest}")
    def get_version(digest: str) -> dict[str, Any]:
        return dict(version_or_404(digest).to_json())

    @app.get("/api/versions/{digest}/yaml", response_class=PlainTextResponse)
    def get_version_yaml(digest: str) -> str:
        return str(version_or_404(digest).yaml())

    @app.get("/api/diff")
    def get_diff(a: str, b: str) -> dict[str, Any]:
        return diff(version_or_404(a), version_or_404(b))

    # -- runs ---------------------------------------------------------------------------------
    @app.get("/api/runs")
    def get_runs() -> dict[str, Any]:
        return {"runs": runs_mod.list_runs(runs_root, store)}

    @app.post("/api/runs", status_code=202, response_model=None)
    async def start_run(request: Request) -> dict[str, Any] | JSONResponse:
        body = await _json(request)
        kind = body.get("kind", "run")
        mode = body.get("mode", "local")
        errors = []
        if kind not in ("run", "benchmark"):
            errors.append({"path": "kind", "message": "run or benchmark"})
        if mode not in ("local", "inventory"):
            errors.append({"path": "mode", "message": "local or inventory"})
        if mode == "inventory" and not config.inventory.exists():
            errors.append({"path": "mode", "message": f"no inventory at {config.inventory}"})
        version = store.find(str(body.get("version", "")))
        if version is None:
            errors.append({"path": "version", "message": "no such saved version"})
        if errors or version is None:
            return _unprocessable(errors)
        chosen = version
        if kind == "benchmark":
            # the profiling-only pipeline: the same scenario without inference and optimisation
            document = json.loads(json.dumps(version.document))
            document.setdefault("inference", {})["enabled"] = False
            document.setdefault("optimisation", {})["enabled"] = False
            document["inference"].pop("partition_points", None)
            problems = validate(document)
            if problems:
                return _unprocessable(field_errors(problems))
            chosen, _ = await asyncio.to_thread(
                store.save, document, expand(document), "benchmark", version.hash
            )
        record = await asyncio.to_thread(
            runs_mod.launch, chosen, kind, mode, runs_root, config.inventory.resolve(), store
        )
        return {
            "launch": record.id,
            "pid": record.pid,
            "version": chosen.summary(),
            "kind": kind,
            "mode": mode,
        }

    @app.get("/api/launches/{launch_id}")
    def get_launch(launch_id: str) -> dict[str, Any]:
        row = next((r for r in store.launches() if r["id"] == launch_id), None)
        if row is None:
            raise HTTPException(404, f"no launch {launch_id}")
        runs_mod.tag_runs(runs_root, store)
        mine = [r for r in runs_mod.list_runs(runs_root, store) if r.get("launch") == launch_id]
        from dit.procs import pid_alive

        log = Path(row["log"])
        tail_text = log.read_text(encoding="utf-8", errors="replace")[-4000:] if log.exists() else ""
        return {**row, "alive": pid_alive(int(row["pid"])), "runs": mine, "log_tail": tail_text}

    def run_or_404(scenario: str, run: str) -> RunDir:
        try:
            return runs_mod.run_dir_of(runs_root, scenario, run)
        except runs_mod.RunNotFound:
            raise HTTPException(404, f"no run {scenario}/{run}") from None

    @app.get("/api/runs/{scenario}/{run}")
    def get_run(scenario: str, run: str) -> dict[str, Any]:
        return runs_mod.run_detail(run_or_404(scenario, run), runs_root, store)

    @app.post("/api/runs/{scenario}/{run}/stop", status_code=202)
    def stop(scenario: str, run: str) -> dict[str, Any]:
        rundir = run_or_404(scenario, run)
        summary = runs_mod.run_summary(rundir, runs_root, store)
        if summary["state"] in runs_mod.STATES_DONE:
            raise HTTPException(409, f"the run is already {summary['state']}")
        proc = runs_mod.stop_run(rundir)
        return {"stopping": summary["key"], "pid": proc.pid}

    @app.get("/api/runs/{scenario}/{run}/plots/{plot}.png")
    async def plot(scenario: str, run: str, plot: str) -> Response:
        from dit.web.plots import layers_png, monitors_png

        agg = run_or_404(scenario, run).path / "aggregate"
        if plot == "validation":
            if not (agg / "validation.png").is_file():
                raise HTTPException(404, "no validation plot")
            return FileResponse(agg / "validation.png", media_type="image/png")
        makers = {"layers": (layers_png, "layers.csv"), "monitors": (monitors_png, "monitors.csv")}
        if plot not in makers:
            raise HTTPException(404, f"no plot {plot}")
        make, name = makers[plot]
        if not (agg / name).is_file():
            raise HTTPException(404, f"the run has no {name}")
        png = await asyncio.to_thread(make, agg / name)
        return Response(png, media_type="image/png", headers={"Cache-Control": "no-store"})

    @app.get("/api/runs/{scenario}/{run}/optimise")
    def get_optimise(scenario: str, run: str) -> dict[str, Any]:
        folder = run_or_404(scenario, run).path / "optimise"
        results = []
        for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
            with contextlib.suppress(ValueError, OSError):
                results.append({"file": path.name, **json.loads(path.read_text(encoding="utf-8"))})
        return {"results": results}

    @app.post("/api/runs/{scenario}/{run}/optimise", response_model=None)
    async def optimise(scenario: str, run: str, request: Request) -> dict[str, Any] | JSONResponse:
        from dit.aggregate import AggregateError
        from dit.optimise import OptimiseError
        from dit.optimise.api import optimise_run

        rundir = run_or_404(scenario, run)
        body = await _json(request)
        summary = runs_mod.run_summary(rundir, runs_root, store)
        if summary["state"] not in runs_mod.STATES_DONE:
            raise HTTPException(409, "the run has not finished")
        settings: dict[str, str | None] = {}
        for key in ("algorithm", "objective", "policy"):
            value = body.get(key)
            if value is not None and not isinstance(value, str):
                return _unprocessable([{"path": key, "message": "a name"}])
            settings[key] = value or None
        try:
            result = await asyncio.to_thread(
                optimise_run,
                rundir.path,
                settings["algorithm"],
                settings["objective"],
                settings["policy"],
                None,
            )
        except (OptimiseError, AggregateError) as exc:
            return _unprocessable([{"path": "", "message": str(exc)}])
        data: dict[str, Any] = json.loads(result.to_json())
        data["file"] = result.output_path.name
        data["validation_png"] = (rundir.path / "aggregate" / "validation.png").is_file()
        return data

    @app.websocket("/api/runs/{scenario}/{run}/terminal")
    async def run_terminal(
        ws: WebSocket, scenario: str, run: str, offset: int | None = None, node: str | None = None
    ) -> None:
        try:
            rundir = runs_mod.run_dir_of(runs_root, scenario, run)
        except runs_mod.RunNotFound:
            await ws.close(code=4404)
            return

        def finished() -> bool:
            state = runs_mod.run_summary(rundir, runs_root, store)["state"]
            return state in (*runs_mod.STATES_DONE, "dead")

        await tail(ws, rundir.log, offset, finished, node)

    # -- runtimes -----------------------------------------------------------------------------
    @app.get("/api/runtimes")
    def get_runtimes() -> dict[str, Any]:
        return {
            "runtimes": [
                {
                    "id": "builtin",
                    "title": "built-in (layer-by-layer profile + partitioned inference)",
                    "checks": list(CHECKS),
                }
            ],
            "actions": [
                {"id": a.id, "title": a.title, "description": a.description, "tags": list(a.tags)}
                for a in ACTIONS.values()
            ],
            "history": [a.to_json() for a in sorted(actions.items.values(), key=lambda a: -a.started_ns)],
        }

    def chosen_hosts(body: dict[str, Any]) -> list[str] | JSONResponse:
        if not config.inventory.exists():
            return _unprocessable([{"path": "hosts", "message": f"no inventory at {config.inventory}"}])
        names = [n.name for n in inventory.nodes()]
        hosts = body.get("hosts") or [n.name for n in inventory.nodes() if n.role == "device"]
        if not isinstance(hosts, list) or not hosts or any(h not in names for h in hosts):
            return _unprocessable(
                [{"path": "hosts", "message": f"nodes of the inventory ({', '.join(names)})"}]
            )
        return [str(h) for h in hosts]

    @app.post("/api/runtimes/check", status_code=202, response_model=None)
    async def runtime_check(request: Request) -> dict[str, Any] | JSONResponse:
        body = await _json(request)
        hosts = chosen_hosts(body)
        if isinstance(hosts, JSONResponse):
            return hosts
        model = body.get("model") or "fake"
        if not isinstance(model, str):
            return _unprocessable([{"path": "model", "message": "a model name"}])
        return actions.check(hosts, model).to_json()

    @app.post("/api/runtimes/actions", status_code=202, response_model=None)
    async def runtime_action(request: Request) -> dict[str, Any] | JSONResponse:
        body = await _json(request)
        if body.get("action") not in ACTIONS:
            return _unprocessable([{"path": "action", "message": f"one of {', '.join(ACTIONS)}"}])
        hosts = chosen_hosts(body)
        if isinstance(hosts, JSONResponse):
            return hosts
        return actions.maintenance(str(body["action"]), hosts).to_json()

    @app.get("/api/actions/{action_id}")
    def get_action(action_id: str) -> dict[str, Any]:
        action = actions.items.get(action_id)
        if action is None:
            raise HTTPException(404, f"no action {action_id}")
        return action.to_json()

    @app.websocket("/api/actions/{action_id}/terminal")
    async def action_terminal(ws: WebSocket, action_id: str, offset: int | None = Query(None)) -> None:
        action = actions.items.get(action_id)
        if action is None:
            await ws.close(code=4404)
            return
        await tail(ws, action.log, offset, lambda: action.finished)

    return app


def serve(config: WebConfig) -> None:
    """Run NNPM with uvicorn until interrupted; prints the address (and the token, when exposed)."""
    import uvicorn

    token = config.ensure_token()
    app = create_app(config)
    where = f"http://{config.host}:{config.port}/"
    print(f"NNPM: {where}" + (f"?token={token}" if token else ""), flush=True)
    if token:
        print(f"NNPM: bound to {config.host}: every request needs the token {token}", flush=True)
    uvicorn.run(app, host=config.host, port=config.port, log_level="warning", ws="websockets-sansio")
