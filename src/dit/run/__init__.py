"""The run engine: one scenario run from its run directory to teardown.

:mod:`.driver` sequences the stages; :mod:`.ansible_exec` runs a stage's playbook through ansible-runner
against the run's :mod:`.inventory` (local mode's fake nodes: :mod:`.localmode`); :mod:`.journal` holds
the undo records teardown (:mod:`.teardown`) replays; :mod:`.rundir` is the run directory, :mod:`.procs`
the run's processes, :mod:`.lease` which run holds a node; :mod:`.console` and :mod:`.follow` are what the
user sees live; :mod:`.dryrun` is ``dit run --check``.
"""
