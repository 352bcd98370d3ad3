# Journal-before-change wrapper (see dit.ansible_plugins.journaled): the commands that remove the run's
# iptables chain and its jump are journaled before they are installed.
from dit.ansible_plugins.journaled import JournaledAction as ActionModule

__all__ = ["ActionModule"]
