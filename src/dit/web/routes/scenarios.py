"""Scenarios: the schema, validation, saved versions with history and diff, the shipped files."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from dit.scenario import ScenarioError, expand, load_schema, load_yaml, validate
from dit.web.routes.common import Context, Ctx, field_errors, json_body, unprocessable
from dit.web.routes.nodes import delay_rule, map_points, rule_json
from dit.web.services.measured import measured_links
from dit.web.services.store import Version, diff, opens, version_hash
from dit.web.services.topology import apply_map_delays, topology_delays

router = APIRouter(prefix="/api")


@router.get("/schema")
def get_schema() -> dict[str, Any]:
    return load_schema()


def scenario_files(ctx: Context) -> list[dict[str, Any]]:
    folder = ctx.config.scenarios_dir
    if not folder.is_dir():
        return []
    return [{"file": p.name, "name": p.stem} for p in sorted(folder.glob("*.yaml")) if p.is_file()]


@router.get("/scenarios")
def get_scenarios(ctx: Ctx) -> dict[str, Any]:
    return {"stored": ctx.store.names(), "files": scenario_files(ctx)}


@router.get("/scenarios/files/{file}", response_model=None)
def get_scenario_file(ctx: Ctx, file: str) -> dict[str, Any] | JSONResponse:
    if file not in {f["file"] for f in scenario_files(ctx)}:
        raise HTTPException(404, f"no scenario file {file}")
    try:
        document = load_yaml(ctx.config.scenarios_dir / file)
    except ScenarioError as exc:
        return unprocessable(field_errors(exc.errors))
    return {"file": file, "document": document}


def check_document(body: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, str]]]:
    """The scenario of a request (``document`` or ``yaml``) and its field errors."""
    document = body.get("document")
    if "yaml" in body and document is None:
        try:
            document = load_yaml(str(body["yaml"]))
        except ScenarioError as exc:
            return {}, field_errors(exc.errors)
    if not isinstance(document, dict):
        return {}, [{"path": "", "message": "the scenario must be a mapping"}]
    return document, field_errors(validate(document))


@router.post("/scenarios/validate")
async def validate_scenario(request: Request) -> dict[str, Any]:
    document, errors = check_document(await json_body(request))
    result: dict[str, Any] = {"valid": not errors, "errors": errors}
    if not errors:
        result["hash"] = version_hash(document)
        result["variants"] = [{"label": v.label, "hash": v.hash} for v in expand(document)]
    return result


@router.post("/scenarios", status_code=201, response_model=None)
async def save_scenario(ctx: Ctx, request: Request) -> dict[str, Any] | JSONResponse:
    document, errors = check_document(await json_body(request))
    if errors:
        return unprocessable(errors)
    version, created = await asyncio.to_thread(ctx.store.save, document, expand(document))
    return {"version": version.to_json(), "created": created}


def map_links(raw: Any) -> tuple[list[tuple[str, str]], list[dict[str, str]]]:
    """``from_map``: the links (``{"device", "peer"}``) whose destination delay the map wrote earlier
    and may write again; every other typed delay is kept."""
    if not isinstance(raw, list):
        return [], [{"path": "from_map", "message": "a list of {device, peer} links"}]
    out: list[tuple[str, str]] = []
    errors: list[dict[str, str]] = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            errors.append({"path": f"from_map[{i}]", "message": "a {device, peer} object"})
            continue
        for key in ("device", "peer"):
            if not isinstance(item.get(key), str) or not item[key]:
                errors.append({"path": f"from_map[{i}].{key}", "message": "a node name (a non-empty string)"})
        if not errors:
            out.append((item["device"], item["peer"]))
    return out, errors


@router.get("/scenarios/{name}/measured-links", response_model=None)
async def get_measured_links(ctx: Ctx, name: str) -> dict[str, Any] | JSONResponse:
    """What the latest run of scenario ``name`` measured on each link (RTTs; none when it has no run)."""
    try:
        return await asyncio.to_thread(measured_links, ctx.runs_root, name)
    except ValueError as exc:
        return unprocessable([{"path": "name", "message": str(exc)}])


@router.post("/scenarios/topology", response_model=None)
async def apply_topology(ctx: Ctx, request: Request) -> dict[str, Any] | JSONResponse:
    """The document with the map's per-destination delays merged into its ``network`` block."""
    body = await json_body(request)
    document = body.get("document")
    if not isinstance(document, dict):
        return unprocessable([{"path": "", "message": "the scenario must be a mapping"}])
    devices = [d for d in document.get("devices") or [] if isinstance(d, str)]
    from_map, errors = map_links(body.get("from_map", []))
    if errors:
        return unprocessable(errors)
    valid, _view = map_points(ctx)  # the floor plan's or the world map's positions, as the map shows
    edge = next((p.name for p in valid if p.role == "edge"), None)
    rule = delay_rule(ctx)
    delays = topology_delays(valid, rule)
    missing = [d for d in devices if d not in delays] if rule is not None else []
    network, links = apply_map_delays(
        delays, devices, edge, bool(body.get("device_links")), document.get("network") or {}, from_map
    )
    out = dict(document)
    if network:
        out["network"] = network
    # per link: the delay that applies and where it comes from (typed values are kept, and said so)
    return {"document": out, "edge": edge, "delays": delays, "not_on_map": missing, "links": links,
            "delay_rule": rule_json(rule)}  # fmt: skip


@router.get("/scenarios/{name}/versions")
def get_history(ctx: Ctx, name: str) -> dict[str, Any]:
    """The versions of ``name``, newest first, and ``opens``: the one the editor shows (never derived)."""
    history = ctx.store.history(name)
    return {
        "name": name,
        "versions": [v.summary() for v in history],
        "opens": opens(history).hash if history else None,
    }


def version_or_404(ctx: Context, digest: str) -> Version:
    version = ctx.store.find(digest)
    if version is None:
        raise HTTPException(404, f"no version {digest}")
    return version


@router.get("/versions/{digest}")
def get_version(ctx: Ctx, digest: str) -> dict[str, Any]:
    return dict(version_or_404(ctx, digest).to_json())


@router.put("/versions/{digest}/note", response_model=None)
async def put_version_note(ctx: Ctx, digest: str, request: Request) -> dict[str, Any] | JSONResponse:
    """Set the version's note (``{"text": …}``; empty removes it): the version itself stays as saved."""
    version = version_or_404(ctx, digest)
    text = (await json_body(request)).get("text")
    if not isinstance(text, str):
        return unprocessable([{"path": "text", "message": "a string (an empty one removes the note)"}])
    try:
        noted = await asyncio.to_thread(ctx.store.set_note, version.hash, text)
    except ValueError as exc:
        return unprocessable([{"path": "text", "message": str(exc)}])
    return dict(noted.summary())


@router.get("/versions/{digest}/yaml", response_class=PlainTextResponse)
def get_version_yaml(ctx: Ctx, digest: str) -> str:
    return str(version_or_404(ctx, digest).yaml())


@router.get("/diff")
def get_diff(ctx: Ctx, a: str, b: str) -> dict[str, Any]:
    """Always from the older version to the newer, whichever order they are named in: additions are ``+``."""
    first, second = version_or_404(ctx, a), version_or_404(ctx, b)
    if (second.created_ns, second.hash) < (first.created_ns, first.hash):
        first, second = second, first
    return diff(first, second)
