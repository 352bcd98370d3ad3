# Journal-before-change wrapper (see dit.ansible_plugins.journaled): records the run directory
# before creating it, and ships the device code in the same task.
from dit.ansible_plugins.processes import NodeAction as ActionModule

__all__ = ["ActionModule"]
