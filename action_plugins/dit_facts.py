# Ansible's normal action, validating the arguments of the module dit ships: see dit.ansible_plugins.node_module.
from dit.ansible_plugins.node_module import NormalNodeModuleAction as ActionModule

__all__ = ["ActionModule"]
