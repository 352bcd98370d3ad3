# Journal-before-change wrapper (see dit.ansible_plugins.journaled): a tagged process is recorded
# as the intent to start it, before it is started.
from dit.ansible_plugins.processes import ProcessAction as ActionModule

__all__ = ["ActionModule"]
