"""Tools for dit's developers, not used by a run: the generated scenario reference (:mod:`.schemadoc`), the
roles' README tables (:mod:`.roledoc`) and the stage templates' lint (:mod:`.lint_playbooks`)."""
