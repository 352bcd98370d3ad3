"""The emulated rack's builders (dit.rack.plan): names, addresses, argv, cgroup files, inventory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from dit.rack.plan import (
    INFERENCE_INTERFACE,
    RT_BUDGET_US,
    CgroupLayout,
    CgroupWrite,
    HostNetwork,
    RackError,
    RackSpec,
    UndoScope,
    bridge_address,
    bridge_name,
    cgroup_steps,
    collisions,
    cpu_quota_writes,
    inventory,
    inventory_yaml,
    known_hosts,
    memory_writes,
    network_steps,
    nodes,
    process_cgroup,
    procs_files,
    rack_id,
    rt_budgets_us,
    sshd_argv,
    sshd_config,
    state_doc,
)

V1 = CgroupLayout(1, Path("/cg"))
RID = rack_id(Path("/state"))  # the state dir's id: every name of the rack carries it
CG = f"dit-rack-{RID}"  # the rack's parent cgroup
NS = f"dit-rack-{RID}-"  # the prefix of its namespaces
V2 = CgroupLayout(2, Path("/cg"))


def spec(**kwargs: object) -> RackSpec:
    base: dict[str, object] = {
        "state_dir": Path("/state"),
        "devices": 3,
        "cpu_share_pct": 30,
        "memory_mb": 256,
    }
    base.update(kwargs)
    return RackSpec(**base)  # type: ignore[arg-type]


def test_nodes_have_distinct_names_addresses_and_interfaces_within_linux_limits() -> None:
    all_nodes = nodes(spec(devices=200, name="abcdef"))
    assert [n.name for n in all_nodes[:3]] == ["edge", "device1", "device2"]
    assert all_nodes[0].address == "10.213.0.10"
    assert all_nodes[-1].address == "10.213.0.210"
    for attribute in ("name", "netns", "veth", "address", "cgroup"):
        assert len({getattr(n, attribute) for n in all_nodes}) == len(all_nodes)
    assert max(len(n.veth) for n in all_nodes) <= 15  # IFNAMSIZ - 1
    assert len(bridge_name(spec(name="abcdef"))) <= 15
    assert bridge_address(spec()) not in {n.address for n in all_nodes}


def test_the_edge_is_uncapped_and_devices_get_the_share_and_limit() -> None:
    edge, *devices = nodes(spec(cpus="1", all_cpus="0"))
    assert (edge.cpu_share_pct, edge.memory_mb, edge.cpus, edge.role) == (None, None, "0", "edge")
    assert {(d.cpu_share_pct, d.memory_mb, d.cpus, d.role) for d in devices} == {(30, 256, "1", "device")}


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"devices": 0}, "--devices"),
        ({"devices": 201}, "--devices"),
        ({"cpu_share_pct": 0}, "--cpu-share"),
        ({"cpu_share_pct": 201, "host_cpus": 2}, "--cpu-share"),
        ({"memory_mb": 8}, "--memory-mb"),
        ({"name": "Bad-name"}, "--name"),
        ({"name": "toolong7"}, "--name"),
        ({"subnet": "192.168.1"}, "--subnet"),
        ({"subnet": "10.300.1"}, "--subnet"),
    ],
)
def test_bad_options_are_refused_naming_the_option(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(RackError, match=field):
        spec(**kwargs).validate()


def test_cpu_share_up_to_every_core_is_accepted() -> None:
    spec(cpu_share_pct=200, host_cpus=2).validate()


def test_cpu_quota_files_v1_and_v2() -> None:
    # a 10 ms period: the quota is spread finely, so the node looks like a uniformly slower CPU
    assert cpu_quota_writes(V1, "dit-rack/device1", 30) == [
        CgroupWrite(Path("/cg/cpu/dit-rack/device1/cpu.cfs_period_us"), "3334"),
        CgroupWrite(Path("/cg/cpu/dit-rack/device1/cpu.cfs_quota_us"), "1000"),
    ]
    assert cpu_quota_writes(V1, "x", None)[1].value == "-1"
    assert cpu_quota_writes(V2, "x", 150) == [CgroupWrite(Path("/cg/x/cpu.max"), "3000 2000")]
    assert cpu_quota_writes(V2, "x", None) == [CgroupWrite(Path("/cg/x/cpu.max"), "max 100000")]
    # below 10 % the period grows so that the quota stays at the kernel's 1 ms minimum or above
    assert cpu_quota_writes(V2, "x", 5) == [CgroupWrite(Path("/cg/x/cpu.max"), "1000 20000")]


def test_devices_whose_quotas_exceed_their_cpus_are_warned_about() -> None:
    assert spec(devices=4, cpu_share_pct=25, cpus="1").oversubscription() is None
    assert spec(devices=4, cpu_share_pct=50, cpus="1,2").oversubscription() is None
    warning = spec(devices=4, cpu_share_pct=40, cpus="1").oversubscription()
    assert warning is not None
    assert "--cpu-share 40" in warning and "160 %" in warning and "--cpu-share 25 or less" in warning


def test_memory_limit_files_v1_and_v2() -> None:
    assert memory_writes(V1, "x", 256) == [
        CgroupWrite(Path("/cg/memory/x/memory.limit_in_bytes"), "268435456")
    ]
    assert memory_writes(V2, "x", 1) == [CgroupWrite(Path("/cg/x/memory.max"), "1048576")]
    assert memory_writes(V1, "x", None) == []


def test_processes_join_every_v1_controller_or_the_one_v2_group() -> None:
    assert procs_files(V1, "r/e") == [
        Path(f"/cg/{c}/r/e/cgroup.procs") for c in ("cpu", "cpuacct", "memory", "cpuset")
    ]
    assert procs_files(V2, "r/e") == [Path("/cg/r/e/cgroup.procs")]


def test_cgroup_steps_make_the_parent_first_with_its_cpuset_before_any_node() -> None:
    steps = cgroup_steps(spec(devices=2, cpus="1", all_cpus="0"), V1, "0")
    assert [s.host for s in steps] == ["controller", "controller", "edge", "device1", "device2"]
    assert all(s.op == "cgroup" for s in steps)
    parent = {w.path.name: w.value for w in steps[0].writes}
    assert parent["cpuset.cpus"] == "0,1" and parent["cpuset.mems"] == "0"
    device = {str(w.path): w.value for w in steps[3].writes}
    assert device[f"/cg/cpuset/{CG}/device1/cpuset.cpus"] == "1"
    assert device[f"/cg/cpu/{CG}/device1/cpu.cfs_quota_us"] == "1000"
    assert device[f"/cg/memory/{CG}/device1/memory.limit_in_bytes"] == str(256 << 20)
    # cpuset.mems and cpuset.cpus must be written before a task can join a v1 cpuset.
    names = [w.path.name for w in steps[3].writes]
    assert names.index("cpuset.mems") < names.index("cpuset.cpus")
    assert f"/cg/memory/{CG}/device1" in steps[3].undo["dirs"]
    edge = {w.path.name: w.value for w in steps[2].writes}
    assert edge["cpu.cfs_quota_us"] == "-1" and "memory.limit_in_bytes" not in edge
    assert "cpu.shares" not in edge  # an uncapped edge on every CPU of the host keeps the default weight


def test_an_edge_with_cpus_of_its_own_gets_the_top_weight_but_never_all_the_host_cpus() -> None:
    steps = cgroup_steps(spec(devices=2, cpus="1", all_cpus="0", host_cpus=2), V1, "0")
    edge = {w.path.name: w.value for w in steps[2].writes}
    assert edge["cpu.cfs_quota_us"] == "-1" and edge["cpu.shares"] == "262144"
    steps = cgroup_steps(spec(devices=2, cpus="0", all_cpus="0", host_cpus=1), V1, "0")
    assert "cpu.shares" not in {w.path.name for w in steps[2].writes}


def test_v2_enables_the_controllers_for_the_children() -> None:
    steps = cgroup_steps(spec(devices=1), V2, "0")
    writes = [(str(w.path), w.value) for w in steps[0].writes]
    assert writes[0] == ("/cg/cgroup.subtree_control", "+cpu +cpuset +memory")
    assert writes[-1] == (f"/cg/{CG}/cgroup.subtree_control", "+cpu +cpuset +memory")


def test_network_steps_journal_what_they_create_and_put_every_node_on_the_bridge() -> None:
    steps = network_steps(spec(devices=1))
    created = [(s.op, s.undo) for s in steps if s.op != "noop"]
    assert created == [
        ("link", {"link": f"dr-{RID}-br"}),
        ("netns", {"netns": f"{NS}edge"}),
        ("link", {"link": f"dr-{RID}-0"}),
        ("netns", {"netns": f"{NS}device1"}),
        ("link", {"link": f"dr-{RID}-1"}),
    ]
    argvs = [s.argv for s in steps]
    assert ("ip", "addr", "add", "10.213.0.1/24", "dev", f"dr-{RID}-br") in argvs
    assert ("ip", "link", "set", f"dr-{RID}-1", "master", f"dr-{RID}-br") in argvs
    assert (
        "ip",
        "-n",
        f"{NS}device1",
        "addr",
        "add",
        "10.213.0.11/24",
        "dev",
        INFERENCE_INTERFACE,
    ) in argvs
    veth = next(s.argv for s in steps if s.undo == {"link": f"dr-{RID}-1"})
    assert veth[-4:] == ("name", INFERENCE_INTERFACE, "netns", f"{NS}device1")
    assert all(isinstance(a, str) for argv in argvs for a in argv)


def test_sshd_listens_on_the_node_address_with_rack_keys_only() -> None:
    s = spec()
    node = nodes(s)[1]
    config = sshd_config(s, node)
    assert "ListenAddress 10.213.0.11\n" in config
    assert "HostKey /state/keys/host_ed25519\n" in config
    assert "AuthorizedKeysFile /state/keys/authorized_keys\n" in config
    assert "PasswordAuthentication no\n" in config
    assert "PidFile /state/nodes/device1/sshd.pid\n" in config
    # sshd refuses the authorized keys when any directory above them is not root's alone
    assert "StrictModes yes\n" in config and "StrictModes no" not in config
    assert sshd_argv(node, Path("/c")) == (
        "nsenter",
        f"--net=/run/netns/{NS}device1",
        "/usr/sbin/sshd",
        "-D",
        "-e",
        "-f",
        "/c",
    )
    assert known_hosts(spec(devices=1), "ssh-ed25519 AAAAkey comment\n") == (
        "10.213.0.10 ssh-ed25519 AAAAkey\n10.213.0.11 ssh-ed25519 AAAAkey\n"
    )


def test_inventory_has_edge_and_devices_reachable_over_the_bridge() -> None:
    s = spec(devices=2)
    doc = yaml.safe_load(inventory_yaml(s, python="/py"))
    assert doc == inventory(s, python="/py")
    groups = doc["all"]["children"]
    assert list(groups["edge"]["hosts"]) == ["edge"]
    assert list(groups["devices"]["hosts"]) == ["device1", "device2"]
    device = groups["devices"]["hosts"]["device2"]
    assert device["ansible_host"] == device["dit_inference_address"] == "10.213.0.12"
    assert device["dit_inference_interface"] == INFERENCE_INTERFACE
    assert device["dit_remote_base"] == "/state/nodes/device2/root"
    assert device["sysfs_root"] == "/state/nodes/device2/sys"
    assert "dit_tc_dry_run" not in device
    common = doc["all"]["vars"]
    assert common["ansible_ssh_private_key_file"] == "/state/keys/controller_ed25519"
    assert "StrictHostKeyChecking=yes" in common["ansible_ssh_common_args"]
    assert "UserKnownHostsFile=/state/known_hosts" in common["ansible_ssh_common_args"]
    assert common["dit_shared_clock"] is True and common["dit_python"] == "/py"


def test_without_netem_the_devices_record_only_the_netem_trees() -> None:
    groups = inventory(spec(devices=1), netem_dry_run=True)["all"]["children"]
    assert groups["devices"]["hosts"]["device1"]["dit_tc_dry_run"] == "netem"
    assert "dit_tc_dry_run" not in groups["edge"]["hosts"]["edge"]


def test_v1_nodes_get_an_rt_budget_so_the_start_wait_may_use_sched_fifo() -> None:
    steps = cgroup_steps(spec(devices=3), V1, "0")
    budgets = [{w.path.name: w.value for w in s.writes}.get("cpu.rt_runtime_us") for s in steps]
    parent, links, *per_node = (int(b) for b in budgets if b is not None)
    assert len(per_node) == 4 and parent == RT_BUDGET_US == rt_budgets_us(3)[0]
    assert links + sum(per_node) <= parent  # the kernel refuses children above their parent
    assert min(per_node) >= 2 * 2_000  # room for the agent's 2 ms spin twice a second
    assert links >= 90_000  # the link emulators' spins before their releases
    big_parent, big_node, big_links = rt_budgets_us(200)
    assert 201 * big_node + big_links <= big_parent <= 900_000 and big_node >= 4_000 and big_links >= 90_000
    assert all(w.optional for s in steps for w in s.writes if w.path.name == "cpu.rt_runtime_us")
    assert not any(
        w.path.name == "cpu.rt_runtime_us" for s in cgroup_steps(spec(), V2, "0") for w in s.writes
    )


def test_on_cgroup_v1_a_run_s_cgroups_nest_in_its_device_node_s() -> None:
    groups = inventory(spec(devices=1), layout=CgroupLayout(1))["all"]["children"]
    device = groups["devices"]["hosts"]["device1"]
    assert device["dit_cgroup_root"] == f"/sys/fs/cgroup/memory/{CG}/device1"
    assert device["dit_cpu_cgroup_root"] == f"/sys/fs/cgroup/cpu/{CG}/device1"
    assert "dit_cpu_cgroup_root" not in groups["edge"]["hosts"]["edge"]


def test_on_cgroup_v2_a_run_s_cgroups_nest_in_its_device_node_s() -> None:
    groups = inventory(spec(devices=1), layout=CgroupLayout(2))["all"]["children"]
    device = groups["devices"]["hosts"]["device1"]
    assert device["dit_cgroup_root"] == f"/sys/fs/cgroup/{CG}/device1"
    assert device["dit_cpu_cgroup_root"] == f"/sys/fs/cgroup/{CG}/device1"
    assert "dit_cgroup_root" not in groups["edge"]["hosts"]["edge"]


def test_v2_node_writes_its_limits_then_enables_controllers_for_its_children() -> None:
    steps = cgroup_steps(spec(devices=1, cpus="1", all_cpus="0,1"), V2, "0")
    device = [s for s in steps if s.host == "device1"]
    node, leaf = device
    assert node.undo == {"dirs": [f"/cg/{CG}/device1"]}
    assert [(str(w.path), w.value) for w in node.writes] == [
        (f"/cg/{CG}/device1/cpuset.mems", "0"),
        (f"/cg/{CG}/device1/cpuset.cpus", "1"),
        (f"/cg/{CG}/device1/cpu.max", "1000 3334"),
        (f"/cg/{CG}/device1/cpu.weight", "10000"),
        (f"/cg/{CG}/device1/memory.max", str(256 << 20)),
        (f"/cg/{CG}/device1/cgroup.subtree_control", "+cpu +cpuset +memory"),
    ]
    # sshd's leaf: a step of its own after the node's, so rack down (newest first) removes it first.
    assert leaf.undo == {"dirs": [f"/cg/{CG}/device1/sshd"]} and leaf.writes == ()
    assert steps.index(leaf) == steps.index(node) + 1
    edge = {str(w.path): w.value for s in steps if s.host == "edge" for w in s.writes}
    assert edge[f"/cg/{CG}/edge/cpu.max"] == "max 100000"
    assert edge[f"/cg/{CG}/edge/cgroup.subtree_control"] == "+cpu +cpuset +memory"
    assert f"/cg/{CG}/edge/memory.max" not in edge


def test_v2_sshd_joins_the_leaf_and_v1_the_node_itself() -> None:
    assert process_cgroup(V2, "dit-rack/device1") == "dit-rack/device1/sshd"
    assert procs_files(V2, process_cgroup(V2, "dit-rack/device1")) == [
        Path("/cg/dit-rack/device1/sshd/cgroup.procs")
    ]
    assert process_cgroup(V1, "dit-rack/device1") == "dit-rack/device1"
    assert [s.host for s in cgroup_steps(spec(devices=1), V1, "0")] == [
        "controller",
        "controller",
        "edge",
        "device1",
    ]


def test_the_link_emulators_run_in_the_rack_s_links_cgroup_outside_every_node_s_quota() -> None:
    """The userspace link emulator stands in for the kernel's netem: in a node's cgroup it took the
    CPU of the node's quota and was throttled with it (packets held 150-280 ms too long)."""
    steps = cgroup_steps(spec(devices=2, cpus="1", all_cpus="0"), V1, "0")
    links = steps[1]
    assert links.undo["dirs"] == [f"/cg/{c}/{CG}/links" for c in ("cpu", "cpuacct", "memory", "cpuset")]
    writes = {str(w.path): w.value for w in links.writes}
    assert writes[f"/cg/cpuset/{CG}/links/cpuset.cpus"] == "0,1"  # every CPU of the rack
    assert writes[f"/cg/cpu/{CG}/links/cpu.rt_runtime_us"] == str(rt_budgets_us(2)[2])
    assert not any(name.endswith(("cfs_quota_us", "limit_in_bytes")) for name in writes)  # no quota, no limit
    for layout, dirs in ((V1, [f"/cg/{c}/{CG}/links" for c in ("cpu", "cpuacct", "memory", "cpuset")]),
                         (V2, [f"/cg/{CG}/links"])):  # fmt: skip
        groups = inventory(spec(devices=1), layout=layout)["all"]["children"]
        for host in (groups["devices"]["hosts"]["device1"], groups["edge"]["hosts"]["edge"]):
            assert host["netem_emulator_cgroup"] == dirs
    assert (
        inventory(spec(devices=1))["all"]["children"]["devices"]["hosts"]["device1"]["netem_emulator_cgroup"]
        == []
    )
    scope = UndoScope(Path("/state"), Path("/cg"))
    assert scope.refusal("cgroup", {"dirs": [f"/cg/cpu/{CG}/links"]}) is None
    assert scope.refusal("cgroup", {"dirs": [f"/cg/cpu/{CG}/links/x"]}) is not None


def test_every_name_carries_the_state_dir_s_id_stable_and_within_linux_limits() -> None:
    first, second = (
        spec(devices=200, name="abcdef"),
        spec(devices=200, name="abcdef", state_dir=Path("/other")),
    )
    assert first.rack_id != second.rack_id and len(first.rack_id) == 6
    assert spec(devices=1, name="x").rack_id == first.rack_id  # from the state dir alone, every time

    def names(s: RackSpec) -> set[str]:
        all_nodes = nodes(s)
        return {bridge_name(s), *(n.veth for n in all_nodes), *(n.netns for n in all_nodes)} | {
            n.cgroup.split("/")[0] for n in all_nodes
        }

    # Same --name, two state dirs: not one link, namespace or cgroup in common.
    assert names(first).isdisjoint(names(second))
    assert max(len(n) for n in (bridge_name(first), *(n.veth for n in nodes(first)))) <= 15  # IFNAMSIZ - 1
    alias = next(s.argv for s in network_steps(first) if "alias" in s.argv)
    assert alias[-1] == "dit rack /state"  # how a second rack names this one's state dir


def _own_records(s: RackSpec, layout: CgroupLayout) -> list[tuple[str, dict[str, object]]]:
    """Every record rack up journals for ``s``: its network and cgroup steps and each node's sshd."""
    records: list[tuple[str, dict[str, object]]] = [
        (step.op, dict(step.undo))
        for step in [*network_steps(s), *cgroup_steps(s, layout, "0")]
        if step.op != "noop"
    ]
    for node in nodes(s):
        procs = procs_files(layout, process_cgroup(layout, node.cgroup))
        pidfile = f"{s.state_dir}/nodes/{node.name}/sshd.pid"
        records.append(("sshd", {"pidfile": pidfile, "procs": [str(p) for p in procs]}))
    return records


@pytest.mark.parametrize("version", [1, 2])
def test_the_undo_scope_allows_every_record_rack_up_journals(version: int) -> None:
    layout = CgroupLayout(version)
    s = spec(devices=12, name="r2d2")
    scope = UndoScope(s.state_dir)
    records = _own_records(s, layout)
    assert {op for op, _ in records} == {"link", "netns", "cgroup", "sshd"}
    assert [(op, scope.refusal(op, undo)) for op, undo in records if scope.refusal(op, undo)] == []


OTHER = spec(state_dir=Path("/var/lib/dit/rack"))  # another rack on the same machine
PROCS = f"/sys/fs/cgroup/cpu/{CG}/edge/cgroup.procs"


@pytest.mark.parametrize(
    ("op", "undo", "named"),
    [
        ("link", {"link": "eth0"}, "'eth0'"),
        ("link", {"link": bridge_name(OTHER)}, bridge_name(OTHER)),
        ("link", {"link": f"dr-{RID}-br0"}, f"dr-{RID}-br0"),
        ("link", {}, "None"),
        ("netns", {"netns": nodes(OTHER)[1].netns}, nodes(OTHER)[1].netns),
        ("netns", {"netns": f"{NS}device1 x"}, "device1 x"),
        ("cgroup", {"dirs": ["/sys/fs/cgroup/cpu/user.slice"]}, "user.slice"),
        ("cgroup", {"dirs": [f"/sys/fs/cgroup/cpu/{CG}", "/sys/fs/cgroup/memory"]}, "/sys/fs/cgroup/memory"),
        ("cgroup", {"dirs": [f"/sys/fs/cgroup/cpu/{CG}/../system.slice"]}, "not a plain absolute path"),
        ("cgroup", {"dirs": [f"/sys/fs/cgroup/cpu/{CG}/device1/run-cgroup"]}, "run-cgroup"),
        ("cgroup", {"dirs": [f"/elsewhere/{CG}"]}, f"/elsewhere/{CG}"),
        ("cgroup", {"dirs": [f"/sys/fs/cgroup/cpu/{OTHER.name}-x/{CG}"]}, "not one of this rack's"),
        ("cgroup", {"dirs": "/sys/fs/cgroup/cpu"}, "without a list"),
        ("sshd", {"procs": ["/sys/fs/cgroup/cpu/cgroup.procs"]}, "/sys/fs/cgroup/cpu"),
        ("sshd", {"procs": [f"/sys/fs/cgroup/cpu/{CG}/edge/tasks"]}, "not a cgroup.procs file"),
        ("sshd", {"procs": [PROCS], "pidfile": "/etc/passwd"}, "/etc/passwd"),
        ("sshd", {"procs": [PROCS], "pidfile": "/state/nodes/../../x"}, "outside"),
        ("dir", {"rmdir": "/var/lib/important"}, "'dir' is not a step"),
        ("command", {"argv": ["rm", "-rf", "/"]}, "'command' is not a step"),
    ],
)  # fmt: skip
def test_the_undo_scope_refuses_records_reaching_outside_the_rack(
    op: str, undo: dict[str, object], named: str
) -> None:
    refusal = UndoScope(Path("/state")).refusal(op, undo)
    assert refusal is not None and named in refusal


def test_a_second_rack_on_a_taken_subnet_is_refused_naming_the_first_rack_and_a_free_subnet() -> None:
    first = spec(state_dir=Path("/var/lib/dit/rack"), subnet="10.213.0")
    host = HostNetwork(
        links={"lo": "", "eth0": "", bridge_name(first): "dit rack /var/lib/dit/rack"},
        addresses=(("lo", "127.0.0.1/8"), ("eth0", "192.168.5.2/24"), (bridge_name(first), "10.213.0.1/24")),
        routes=((bridge_name(first), "10.213.0.0/24"), ("eth0", "192.168.5.0/24")),
    )
    message = collisions(spec(subnet="10.213.0"), host)
    assert message is not None
    assert f"10.213.0.0/24 overlaps 10.213.0.1/24 on {bridge_name(first)}" in message
    assert "the rack in /var/lib/dit/rack" in message and "--state-dir /var/lib/dit/rack" in message
    assert "--subnet 10.213.1 is free" in message and "nothing was built" in message
    assert message.count("10.213.0.0/24 overlaps") == 1  # the bridge's address and route: one link
    assert collisions(spec(subnet="10.213.1"), host) is None


@pytest.mark.parametrize(
    ("host", "named"),
    [
        (HostNetwork(routes=(("tun0", "10.0.0.0/8"),)), "10.0.0.0/8 on tun0"),
        (HostNetwork(addresses=(("eth1", "10.213.0.77/16"),)), "10.213.0.77/16 on eth1"),
        (HostNetwork(links={f"dr-{RID}-br": ""}), f"link dr-{RID}-br exists already"),
        (HostNetwork(links={f"dr-{RID}-2": ""}), f"link dr-{RID}-2 exists already"),
        (HostNetwork(netns=frozenset({f"{NS}edge"})), f"network namespace {NS}edge exists already"),
        (HostNetwork(cgroups=frozenset({f"/sys/fs/cgroup/cpu/{CG}"})), f"cgroup /sys/fs/cgroup/cpu/{CG}"),
    ],
)
def test_any_name_or_address_of_the_new_rack_already_taken_is_a_collision(
    host: HostNetwork, named: str
) -> None:
    message = collisions(spec(), host)
    assert message is not None and named in message


def test_a_default_route_or_other_networks_are_no_collision() -> None:
    host = HostNetwork(
        addresses=(("eth0", "10.0.2.15/24"), ("lo", "127.0.0.1/8")),
        routes=(("eth0", "0.0.0.0/0"), ("eth0", "10.0.2.0/24"), ("eth1", "10.214.0.0/16")),
        links={"dr-abcdef-br": "dit rack /elsewhere"},
    )
    assert collisions(spec(), host) is None


def test_a_rack_whose_quotas_exceed_its_cpus_gets_the_up_command_that_fits() -> None:
    assert spec(devices=4, cpu_share_pct=25, cpus="1").quota_refusal() is None
    over = spec(devices=4, cpu_share_pct=40, cpus="1", memory_mb=2048)
    command = over.fitting_up()
    assert command is not None and command.startswith(
        "dit rack up --devices 4 --cpu-share 25 --memory-mb 2048"
    )
    refusal = over.quota_refusal()
    assert refusal is not None and "ask for 160 % of one CPU but share 1 CPU (1)" in refusal
    assert f"`{command}`" in refusal
    # more devices than 1 % each can fit: as many devices as fit
    assert (spec(devices=150, cpu_share_pct=1, cpus="1").fitting_up() or "").startswith(
        "dit rack up --devices 100 --cpu-share 1 "
    )


def test_the_recorded_spec_reads_back_as_written() -> None:
    s = spec(devices=4, cpu_share_pct=40, cpus="1")
    doc = state_doc(s, CgroupLayout(1), False, "", s.state_dir / "inventory.yml", 0)
    assert RackSpec.recorded(json.loads(json.dumps(doc))["spec"]) == s
    with pytest.raises(RackError, match=r"spec.devices: '4' is not an integer"):
        RackSpec.recorded({**doc["spec"], "devices": "4"})
