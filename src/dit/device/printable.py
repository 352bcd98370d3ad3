"""Text from a node made safe to show on a terminal (stdlib only).

A device name, an error message or a log line can carry what a terminal obeys: ``ESC ]2;…BEL`` sets
the window title, ``ESC [2J`` clears the screen, a lone ``CR`` overwrites what the line said. Rich's
``escape()`` only escapes its own markup and keeps them (issue 46). Every line from a node goes
through :func:`printable` before it is shown: on the console, in ``run.log``, in NNPM's terminal and
in the edge service's own output.
"""

from __future__ import annotations

import re

#: What is shown as an escape: the C0 controls but tab (0x00-0x08, 0x0a-0x1f), DEL and the C1
#: controls (0x80-0x9f: 0x9b is a one-byte CSI to some terminals). Tab is kept: it moves the cursor
#: to the next tab stop and nothing else, and tool output aligns columns with it. Newlines are
#: escaped too: a caller that shows several lines splits them first (one node line is one line).
_CONTROLS = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f]")


def _shown(match: re.Match[str]) -> str:
    return f"\\x{ord(match.group()):02x}"


def printable(text: str) -> str:
    """``text`` with every control character but tab shown as ``\\xNN`` (ESC as ``\\x1b``)."""
    return _CONTROLS.sub(_shown, text)


def printable_lines(text: str) -> list[str]:
    """``text`` split into lines (as ``str.splitlines``), each made :func:`printable`; ``[""]`` for ``""``."""
    return [printable(line) for line in text.splitlines()] or [""]
