# Pack on the node and fetch in the same task (see dit.ansible_plugins.collect_action).
from dit.ansible_plugins.collect_action import CollectAction as ActionModule

__all__ = ["ActionModule"]
