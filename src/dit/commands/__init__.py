"""The ``dit`` command's groups, one module each (:mod:`dit.cli` assembles them into one Typer app): the
runs' lifecycle (:mod:`.runs`), their presentation on the console (:mod:`.show`), what is made from
finished runs (:mod:`.reports`), :mod:`.simulate`, :mod:`.reproduce` and :mod:`.web`. The groups with
their own sub-commands live with their package: ``dit rack`` (:mod:`dit.rack.cli`) and ``dit runtimes``
(:mod:`dit.runtime_ops.cli`)."""
