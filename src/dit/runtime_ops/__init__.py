"""``dit runtimes``: a runtime's readiness checks and maintenance actions, played on the nodes.

:mod:`.plays` runs them through ansible-runner (the CLI and NNPM's Runtimes page call it), :mod:`.cli` is the
command. Above both the runtime interface (:mod:`dit.runtimes`) and the run engine (:mod:`dit.run`), whose
playbook runner and inventory it uses.
"""
