# Journal-before-change wrapper (see dit.ansible_plugins.journaled): the commands that restore the
# interface's prior tc tree are journaled before the tree is changed.
from dit.ansible_plugins.journaled import JournaledAction as ActionModule

__all__ = ["ActionModule"]
