# The documentation dit's modules (library/) share, as an Ansible doc-fragment plugin: a module names
# them in ``extends_documentation_fragment`` (``dit`` for the default DOCUMENTATION, ``dit.run`` for RUN
# ...) and ansible-doc merges them into its own DOCUMENTATION, the module's own keys taking precedence.
# Found through ``doc_fragment_plugins`` in ansible.cfg and ANSIBLE_DOC_FRAGMENT_PLUGINS in every stage
# dit runs (dit.run.ansible_exec.ansible_env).
from __future__ import annotations


class ModuleDocFragment:
    # A journaled module: its action plugin (action_plugins/, the same name) plans, journals, then runs it.
    DOCUMENTATION = r"""
options:
  _dit_plan:
    description:
      - Set by the module's action plugin (C(action_plugins/) of the same name), never by a playbook. The
        module reads the node's current state and returns the C(journal) records (with the prior values
        needed to undo) without changing anything; the plugin appends them to the run's journal before it
        runs the module for real.
    type: bool
    default: false
"""

    # A module acting for one run: the run id that tags, journals and scopes what it does.
    RUN = r"""
options:
  run_id:
    description: The run id.
    type: str
    required: true
"""

    # A module that names the node it runs on (local mode runs every node on one machine).
    NODE = r"""
options:
  host:
    description: The inventory name of this node.
    type: str
    required: true
"""

    # A module that starts processes: where they run (the conditions' cgroups and CPUs, dit.conditions).
    PROCESS = r"""
options:
  cgroup:
    description:
      - A cgroup directory (v1 or v2) the started processes join before they execute, or a list of
        them (on cgroup v1 one per hierarchy, e.g. the run's memory and cpu cgroups). A single path is
        never split on commas.
    type: raw
  cpus:
    description: CPU numbers the started processes and their children are confined to.
    type: list
    elements: int
  verify:
    description:
      - Set by the action plugin from C(dit_device_pyz_sha256), never by a playbook. Maps a file an
        C(argv) names (the shipped C(dit-device.pyz)) to its SHA-256 as shipped. The file is opened
        without following a link once its directory and every parent are root's alone, hashed from
        that descriptor, refused on a mismatch (naming both hashes), and run as C(/proc/self/fd/N),
        so that a file put in its place after the check is never run.
    type: dict
    default: {}
"""

    # The nodes dit's modules run on.
    LINUX = r"""
attributes:
  platform:
    support: full
    platforms: posix
    details: Linux nodes (reads C(/proc) and sysfs).
"""
