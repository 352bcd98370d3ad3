"""HeadSplit's side of the dit runtime interface: the modules that import the testbed.

:mod:`headsplit.dit_runtime` is the entry point (the runtime class and its readiness plays); the
scenario block (:mod:`.schema`), the launch (:mod:`.launch`), the actions (:mod:`.actions`) and the results
parser (:mod:`.results`) are here, and what dit's own commands ask of HeadSplit: its placement model for
``dit simulate`` (:mod:`.placement_model`) and its part of ``dit reproduce ch6`` (:mod:`.chapter6`,
:mod:`.chapter6_tokens`). None of them imports torch: dit loads them in its own environment.
"""
