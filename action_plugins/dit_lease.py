# Journal-before-change wrapper (see dit.ansible_plugins.journaled): the controller decides from the
# node's current lease whether this run may take it (dit.run.lease_decision), then journals the release, then takes it.
from dit.ansible_plugins.lease_action import LeaseAction as ActionModule

__all__ = ["ActionModule"]
