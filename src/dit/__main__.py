"""``python -m dit`` is the ``dit`` command."""

from dit.cli import app

app()
