"""tc-netem shaping of a device's inference interface (``network.<device>``), role ``netem``.

The builder picks the interface (``network.<device>.interface``, else the inventory's
``dit_inference_interface``), refuses the management interface (``dit_management_interface``;
the ``dit_tc`` module also refuses the default-route interface on the node), resolves every
destination to an address, and passes the tree of :func:`dit.conditions.netem.tc.build_tree` to the
role. In local mode (and with ``dit_tc_dry_run``) every ``tc`` argv is recorded in a JSON-lines log
next to the node's run root instead of being run: this kernel has no ``sch_netem``. With
``dit_tc_dry_run: netem`` (the emulated rack's inventory on such a kernel) only the trees that need
netem are recorded, rate-only trees run, and :func:`preflight_notes` says so in the run log.

The package is the whole controller side of netem: the tc tree (:mod:`.tc`), the preflight gate
(:func:`preflight`: a kernel without ``sch_netem``; :func:`preflight_notes`), the interfaces its undo
may touch (:func:`undo_scope`) and the network self-check of a collected run (:mod:`.check`, the
:func:`aggregate` step). The node side ships
from elsewhere: the ``dit_tc`` module (``library/dit_tc.py``), the ``netem`` role and the
delay-variation process (:mod:`dit.device.netem_vary`).

Order 40: before the edge service starts (its capacity profile does not cross the link, so the
order does not matter there), before the traffic and load conditions that use the link.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from dit.conditions import Condition, HostContext, PreflightFacts, UndoScope
from dit.conditions.netem.nfqueue import build_userspace, choose_backend, rate_only, requested_backend
from dit.conditions.netem.tc import NetemError, build_tree, check_interface, needs_netem, netem_gate
from dit.runtime_api import registry
from dit.runtime_api.interface import sends_from_source_address
from dit.scenario import Scenario
from dit.scenario.errors import Report
from dit.scenario.pathexpr import Segment

if TYPE_CHECKING:
    from dit.analysis.run import LoadedRun

CONDITION = Condition(
    name="netem",
    role="netem",
    order=40,
    variables=(
        "netem_interface",
        "netem_netns",
        "netem_tree",
        "netem_dry_run",
        "netem_log",
        "netem_protected_interfaces",
        "netem_variation",
        "netem_backend",
        "netem_userspace",
    ),
)
EMULATOR_SOCKET = "link-emulator.sock"  # beside the node's run files: netem-vary sends it the delay


def _check_loss_correlation(where: list[Segment], profile: Mapping[str, Any], err: Report) -> None:
    """A loss correlation correlates loss draws: without a loss there are none (netem draws none)."""
    correlation, loss = profile.get("loss_correlation_pct"), profile.get("loss_pct")
    if (
        isinstance(correlation, int | float)
        and correlation > 0
        and not (isinstance(loss, int | float) and loss > 0)
    ):
        err(
            [*where, "loss_correlation_pct"],
            f"a loss correlation ({correlation:g} %) needs a loss: set loss_pct above 0 beside it",
        )


def check_block(block: str, dev: str, conf: Mapping[str, Any], err: Report) -> None:
    """``network.<device>``: the variation's range, loss correlations, the destinations' keys."""
    var = conf.get("variation")
    if isinstance(var, dict):
        low, high = var.get("low_ms"), var.get("high_ms")
        if isinstance(low, int | float) and isinstance(high, int | float) and low > high:
            err([block, dev, "variation", "low_ms"], f"low_ms ({low}) is greater than high_ms ({high})")
    _check_loss_correlation([block, dev], conf, err)
    dests = conf.get("destinations")
    if isinstance(dests, dict):
        for target, profile in dests.items():
            if isinstance(profile, dict):
                _check_loss_correlation([block, dev, "destinations", target], profile, err)
            if "/" in target:
                try:
                    ipaddress.ip_network(target, strict=False)
                except ValueError:
                    err([block, dev, "destinations", target], f"{target!r} is not a valid CIDR")
            elif target == dev:
                err([block, dev, "destinations", target], "a device cannot be its own destination")


def dry_run_log(ctx: HostContext) -> str:
    """Where local mode records ``tc`` argv: beside the node's run root, so teardown's are kept."""
    return f"{ctx.node_root}.tc.jsonl"


def resolve_address(target: str, ctx: HostContext, where: str) -> str:
    """A destination key (IP, CIDR or inventory host name) as an address or CIDR.

    ``edge`` (the edge host) is the edge's inference address; another inventory host is looked up
    in ``ctx.addresses`` when the context provides it (host → inference address), and in local mode
    every node is the loopback address.
    """
    try:
        return str(ipaddress.ip_network(target, strict=False))
    except ValueError:
        pass
    candidates: dict[str, str] = {}
    candidates.update(getattr(ctx, "addresses", None) or {})
    candidates.setdefault(ctx.edge_host, ctx.edge_address)
    address = candidates.get(target)
    if address is None and ctx.local:
        address = "127.0.0.1"
    if address is None:
        raise NetemError(
            f"{where}: cannot resolve host {target!r} to its inference address here; "
            "give its IP address or CIDR instead"
        )
    try:
        network = ipaddress.ip_network(address, strict=False)
    except ValueError as exc:
        raise NetemError(
            f"{where}: host {target!r} resolves to {address!r}, not an IP address; set its "
            "dit_inference_address in the inventory"
        ) from exc
    return str(network)


def interface_of(block: Mapping[str, Any], ctx: HostContext) -> str:
    return str(block.get("interface") or ctx.hostvars.get("dit_inference_interface") or "")


def recorded(block: Mapping[str, Any], local: bool, dry_run_var: object) -> bool:
    """Whether the device's tree is recorded instead of run: local mode, ``dit_tc_dry_run: true``,
    or ``dit_tc_dry_run: netem`` (the emulated rack on a kernel without ``sch_netem``) for a tree
    that needs netem; a rate-only tree (tbf) then stays real."""
    if dry_run_var == "netem":
        return local or needs_netem(block)
    return bool(local or dry_run_var)


def _built(metadata: Mapping[str, Any], device: str) -> Mapping[str, Any] | None:
    conditions = metadata.get("conditions") or {}
    netem = (conditions.get(device) or {}).get("netem") if isinstance(conditions, Mapping) else None
    return netem if isinstance(netem, Mapping) else None


def shaping(metadata: Mapping[str, Any], device: str) -> str:
    """How a run treated ``device``'s network condition, from its ``metadata.json``: ``recorded``
    (only logged: local mode, or a kernel without ``sch_netem`` and no userspace backend),
    ``applied``, or ``none`` (no tree)."""
    netem = _built(metadata, device)
    if netem is not None:
        if netem.get("netem_backend") == "userspace":
            return "applied"
        return "recorded" if netem.get("netem_dry_run") else "applied"
    return "recorded" if metadata.get("mode") == "local" else "none"


def backend(metadata: Mapping[str, Any], device: str) -> str:
    """Which backend applied ``device``'s delay, jitter and loss: ``netem``, ``userspace`` (the link
    emulator behind NFQUEUE), or ``""`` when the device has no network condition. Runs from before
    the backends existed were netem."""
    netem = _built(metadata, device)
    if netem is None:
        return ""
    value = str(netem.get("netem_backend") or "netem")
    return "netem" if value == "auto" else value


def build(scenario: Scenario, host: str, ctx: HostContext) -> dict[str, Any] | None:
    block = scenario.network.get(host)
    if ctx.role != "device" or not block:
        return None
    where = f"network.{host}"
    dev = interface_of(block, ctx)
    management = str(ctx.hostvars.get("dit_management_interface") or "")
    check_interface(dev, [management], where)
    destinations = {
        key: resolve_address(key, ctx, f"{where}.destinations.{key}")
        for key in block.get("destinations") or {}
    }
    netns = str(ctx.hostvars.get("dit_netns") or "") or None
    requested = requested_backend(block, ctx.hostvars, where)
    shaping = build_tree(block, dev, device=host, seed=scenario.seed, destinations=destinations, netns=netns)
    if shaping is None:
        return None
    userspace: dict[str, Any] = {}
    # Local mode: every device shares the loopback, so the emulator's chain selects the device by its
    # own source address (the inventory's dit_source_address); a destination naming another device
    # is the loopback too and cannot be told from the edge, so such a block keeps the recorded tc tree.
    source = str(ctx.hostvars.get("dit_source_address") or "") if ctx.local else ""
    blocker = _local_userspace_blocker(scenario, block, ctx, source, where) if ctx.local else None
    if blocker and requested == "userspace":
        raise NetemError(f"{where}.network_backend: userspace is not available in local mode here: {blocker}")
    blocker = blocker or _ipv6_blocker(host, ctx)
    if blocker and requested == "userspace":
        raise NetemError(f"{where}.network_backend: userspace cannot shape this device: {blocker}")
    if requested != "netem" and needs_netem(block) and blocker is None:
        userspace = build_userspace(
            block, dev, device=host, run_id=ctx.run_id, seed=scenario.seed, destinations=destinations,
            netns=netns, source=source or None,
        )  # fmt: skip
        rates = build_tree(
            rate_only(block), dev, device=host, seed=scenario.seed, destinations=destinations, netns=netns
        )
        userspace["tree"] = [o.to_dict() for o in rates.objects] if rates is not None else []
        # local mode still records tc (a rate cap on the shared loopback would cap every node)
        userspace["dry_run"] = bool(ctx.local or ctx.hostvars.get("dit_tc_dry_run") is True)
        userspace["control_socket"] = f"{ctx.node_root}/{EMULATOR_SOCKET}"
        userspace["seed"] = scenario.seed
    dry_run = recorded(block, ctx.local, ctx.hostvars.get("dit_tc_dry_run", False))
    log = dry_run_log(ctx) if dry_run else ""
    variation: dict[str, Any] = {}
    if shaping.vary_template is not None:
        variation = {
            "device": host,
            "seed": scenario.seed,
            "variation": dict(shaping.variation),
            "template": list(shaping.vary_template),
        }
    return {
        "netem_interface": dev,
        "netem_netns": netns or "",
        "netem_tree": [o.to_dict() for o in shaping.objects],
        "netem_dry_run": dry_run,
        "netem_log": log,
        "netem_protected_interfaces": [management] if management else [],
        "netem_variation": variation,
        # Settled after preflight by resolve(); a rate-only block needs no backend choice.
        "netem_backend": requested if userspace else "netem",
        "netem_userspace": userspace,
    }


def _ipv6_blocker(host: str, ctx: HostContext) -> str | None:
    """Why the userspace backend cannot shape ``host``'s inference traffic because it is IPv6 (its
    iptables rules see IPv4 only: the main profile would leave IPv6 packets undelayed); None: IPv4."""
    for who, address in (
        ("the edge", ctx.edge_address),
        (host, (getattr(ctx, "addresses", None) or {}).get(host)),
    ):
        try:
            parsed = ipaddress.ip_address(str(address or ""))
        except ValueError:
            continue  # a host name: resolved on the node, not here
        if parsed.version == 6:
            return (
                f"{who}'s inference address {parsed} is IPv6 and the userspace backend (iptables) shapes IPv4 "
                "only; use network_backend: netem on a kernel with sch_netem, or an IPv4 inference network"
            )
    return None


def _local_userspace_blocker(
    scenario: Scenario, block: Mapping[str, Any], ctx: HostContext, source: str, where: str
) -> str | None:
    """Why local mode cannot give this device the userspace backend (None: it can)."""
    if not source:
        return "the inventory gives the device no dit_source_address of its own"
    runtime = str(scenario.runtime.get("name") or registry.DEFAULT)
    try:
        declares = sends_from_source_address(registry.get(runtime))
    except registry.UnknownRuntime:
        declares = False  # not installed here: nothing says where its processes send from
    if not declares:
        # a runtime whose processes listen and connect on 127.0.0.1: the chain, which selects the
        # device's own address, would leave its traffic undelayed while the pings (and the
        # self-check) showed the delay
        return (
            f"runtime {runtime!r} does not declare sends_from_source_address (its processes sending from "
            "their device's own loopback address), so its traffic could not be selected; use an inventory"
        )
    others = sorted(
        key
        for key in block.get("destinations") or {}
        if key != ctx.edge_host and key in (getattr(ctx, "addresses", None) or {})
    )
    if others:
        return (
            f"{where}.destinations names {', '.join(others)}, another local node on the shared loopback "
            "address, which the emulator cannot tell from the edge; shape towards the edge only, or use an inventory"
        )
    return None


def resolve(facts: PreflightFacts) -> dict[str, dict[str, Any]]:
    """The backend of every device left at ``auto`` or ``userspace``, from its preflight facts.

    A device that gets the userspace backend keeps only the rate part of its tc tree (real, even
    where ``dit_tc_dry_run: netem`` records netem trees), its variation goes to the emulator's
    control socket instead of ``tc qdisc change``, and ``netem_backend`` says which applied (in
    ``metadata.json``, so every report and the undo scope read it from there).
    """
    out: dict[str, dict[str, Any]] = {}
    for host, per_host in facts.built.items():
        variables = per_host.get("netem")
        if not isinstance(variables, Mapping) or variables.get("netem_backend") not in ("auto", "userspace"):
            continue
        plan = variables.get("netem_userspace") or {}
        chosen, _why = choose_backend(
            str(variables["netem_backend"]), facts.nodes.get(host) or {}, facts.local
        )
        updated = dict(variables)
        if chosen == "userspace" and plan:
            updated["netem_tree"] = list(plan.get("tree") or [])
            updated["netem_dry_run"] = bool(plan.get("dry_run"))
            updated["netem_log"] = variables.get("netem_log") if plan.get("dry_run") else ""
            if variables.get("netem_variation"):
                vary = {k: v for k, v in variables["netem_variation"].items() if k != "template"}
                updated["netem_variation"] = {**vary, "control_socket": plan["control_socket"]}
            updated["netem_backend"] = "userspace"
        else:
            updated["netem_backend"] = "netem"
            updated["netem_userspace"] = {}
        out[host] = updated
    return out


def preflight(facts: PreflightFacts) -> str | None:
    """The netem gate: a device that needs ``sch_netem`` on a kernel without it and gets no userspace
    backend, or gets the userspace backend on a node without NFQUEUE or iptables (not in local mode,
    which records the tc commands instead of running them)."""
    network = (
        {}
        if facts.local
        else {
            device: block
            for device, block in facts.scenario.network.items()
            if ((facts.built.get(device) or {}).get("netem") or {}).get("netem_backend") != "userspace"
        }
    )
    problems = netem_gate(network, facts.nodes, facts.hostvars)
    for device in facts.scenario.network:
        if ((facts.built.get(device) or {}).get("netem") or {}).get("netem_backend") != "userspace":
            continue
        nfqueue = (facts.nodes.get(device) or {}).get("nfqueue")
        if isinstance(nfqueue, Mapping) and nfqueue.get("available") is False:
            problems.append(
                f"{device}: network.{device} needs the userspace backend (no sch_netem, or network_backend: "
                f"userspace), but {nfqueue.get('reason', 'NFQUEUE is not available')}; install iptables "
                "(provisioning does) or a kernel with sch_netem"
            )
    return "network shaping refused: " + "; ".join(problems) if problems else None


def preflight_notes(facts: PreflightFacts) -> list[str]:
    """Say plainly which devices lack ``sch_netem`` and only record their netem commands."""
    notes: list[str] = []
    for device, block in facts.scenario.network.items():
        built = (facts.built.get(device) or {}).get("netem") or {}
        if built.get("netem_backend") == "userspace":
            _, why = choose_backend("auto", facts.nodes.get(device) or {}, facts.local)
            notes.append(
                f"{device}: network.{device} is applied by the userspace link emulator (NFQUEUE): {why}"
            )
            continue
        dry_run_var = facts.hostvars.get(device, {}).get("dit_tc_dry_run", False)
        if facts.local or not dry_run_var or not needs_netem(block):
            continue
        node = facts.nodes.get(device) or {}
        if (node.get("netem") or {}).get("available") is False:
            notes.append(
                f"{device}: kernel {node.get('kernel', '?')} has no sch_netem, so this run records the netem "
                f"commands of network.{device} instead of running them (dit_tc_dry_run: {dry_run_var}); "
                "its delays are not applied"
            )
    return notes


def aggregate(run: LoadedRun) -> None:
    """The network self-check of a collected run (``netem_check.csv``, ``netem_changes.csv``)."""
    from dit.conditions.netem.check import aggregate_network  # pandas: only once a run is analysed

    aggregate_network(run)


def undo_scope(host: str, built: Mapping[str, Any] | None, hostvars: Mapping[str, Any]) -> UndoScope | None:
    """The interface the run shaped on ``host``: its ``tc`` undo records touch that one only; with the
    userspace backend its iptables undo records touch the run's own chain only."""
    if not built or not built.get("netem_interface"):
        return None
    interface = {
        "dev": str(built["netem_interface"]),
        "netns": str(built.get("netem_netns") or ""),
        "log": str(built.get("netem_log") or ""),
    }
    userspace = built.get("netem_userspace") or {}
    if built.get("netem_backend") == "userspace" and userspace.get("chain"):
        interface["chain"] = str(userspace["chain"])
    return UndoScope(interfaces=(interface,))
