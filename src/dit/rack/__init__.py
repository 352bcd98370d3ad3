"""The emulated rack: an edge node and N devices on this machine, reached over real SSH.

Each node is a network namespace with a veth on one bridge (the inference network) and its own
address, its own sshd started inside the node's cgroup (CPU quota, memory limit, cpuset), so every
process a run starts there inherits the node's capacity, and its own fake ``/sys`` tree.
``dit rack up`` writes an inventory for ``dit run -i``; ``dit rack down`` undoes the journal.
:mod:`.plan` holds the pure builders, :mod:`.executor` runs them.
"""

from __future__ import annotations

from pathlib import Path

#: Where the rack keeps its journal, keys, node trees and inventory unless told otherwise: the rack
#: is machine-wide (namespaces, a bridge, cgroups), so it lives beside the machine, not a runs dir.
DEFAULT_STATE_DIR = Path("/var/lib/dit/rack")

#: The rack's inference network, its /24's first three octets: private test addresses on a bridge
#: inside this machine (here, not in :mod:`.plan`: ``dit rack``'s options name it, and the plan's
#: imports, Ansible's among them, are not for every ``dit`` command to pay).
DEFAULT_SUBNET = "10.213.0"
