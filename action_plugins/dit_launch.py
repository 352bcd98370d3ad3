# Journal-before-change wrapper (see dit.ansible_plugins.journaled): every process a runtime asked
# for is recorded, by its tag, as the intent to start it, before any of them is started.
from dit.ansible_plugins.processes import LaunchAction as ActionModule

__all__ = ["ActionModule"]
