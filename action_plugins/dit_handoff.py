# Between two stages of one playbook: wait for the driver's variables for the next stage (see
# dit.ansible_plugins.handoff).
from dit.ansible_plugins.handoff import HandoffAction as ActionModule

__all__ = ["ActionModule"]
