# Journal-before-change wrapper: see dit.ansible_plugins.journaled.
from dit.ansible_plugins.journaled import JournaledAction as ActionModule

__all__ = ["ActionModule"]
