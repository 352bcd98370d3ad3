"""The terminal: ``run.log`` (``<UTC time> <node> <stream> <text>`` per line) tailed over a WebSocket.

The server reads the file from the byte offset the client asks for and sends complete lines in
batches, each line with the offset just past it; a client that reconnects with the offset of the
last line it received gets every later line exactly once. The backlog sent on connect is bounded
(:data:`BACKLOG_BYTES`: a client far behind is told how many bytes were skipped), so is each batch,
and the client keeps a bounded buffer too. When the run (or action) has finished and the file has
been read to its end, the server sends ``{"type": "end"}`` and closes.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect

from dit.device.printable import printable

BACKLOG_BYTES = 2 * 1024 * 1024  # at most this much history on connect
BATCH_LINES = 500
POLL_S = 0.25
MAX_LINE = 64 * 1024


def parse_line(line: str) -> dict[str, str]:
    """``<time> <node> <stream> <text>`` as ``{t, n, s, x}`` (a malformed line is all text)."""
    parts = line.split(" ", 3)
    if len(parts) >= 3 and parts[0][:2].isdigit() and "T" in parts[0]:
        return {"t": parts[0], "n": parts[1], "s": parts[2], "x": parts[3] if len(parts) > 3 else ""}
    return {"t": "", "n": "", "s": "", "x": line}


def start_offset(size: int, requested: int | None) -> tuple[int, int]:
    """Where to start reading: ``(offset, skipped_bytes)``."""
    offset = 0 if requested is None or requested < 0 else requested
    if offset > size:  # the file was replaced: start over
        offset = 0
    floor = max(0, size - BACKLOG_BYTES)
    if offset < floor:
        return floor, floor - offset
    return offset, 0


def read_lines(path: Path, offset: int, limit: int = BATCH_LINES) -> tuple[list[dict[str, Any]], int]:
    """Complete lines after ``offset`` (at most ``limit``) and the offset after the last one."""
    try:
        with path.open("rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if size <= offset:
                return [], offset
            handle.seek(offset)
            data = handle.read(min(size - offset, limit * 2048 + MAX_LINE))
    except OSError:
        return [], offset
    if offset > 0 and not _starts_line(path, offset):
        # a skipped backlog starts mid-line: resume at the next line
        cut = data.find(b"\n")
        if cut < 0:
            return [], offset
        data, offset = data[cut + 1 :], offset + cut + 1
    lines: list[dict[str, Any]] = []
    pos = 0
    while len(lines) < limit:
        end = data.find(b"\n", pos)
        if end < 0:
            if len(data) - pos > MAX_LINE:  # a giant unterminated line: pass it on in pieces
                end = pos + MAX_LINE - 1
            else:
                break
        # run.log's own lines are escaped already; an action's log or an older run's may not be
        text = printable(data[pos:end].decode("utf-8", errors="replace").rstrip("\r"))
        pos = end + 1
        lines.append({**parse_line(text), "o": offset + pos})
    return lines, offset + pos


def _starts_line(path: Path, offset: int) -> bool:
    try:
        with path.open("rb") as handle:
            handle.seek(offset - 1)
            return handle.read(1) == b"\n"
    except OSError:
        return True


async def tail(
    ws: WebSocket,
    path: Path,
    offset: int | None,
    finished: Callable[[], bool],
    node: str | None = None,
) -> None:
    """Send ``path``'s lines from ``offset`` until ``finished()`` and the file is read to its end."""
    await ws.accept()
    closed = asyncio.ensure_future(_until_closed(ws))
    try:
        size = path.stat().st_size if path.exists() else 0
        position, skipped = start_offset(size, offset)
        await ws.send_json({"type": "hello", "offset": position, "skipped_bytes": skipped})
        while True:
            done = finished()  # read before the file: a line written just before the end is not lost
            lines, position = await asyncio.to_thread(read_lines, path, position)
            if lines:
                shown = [line for line in lines if node is None or line["n"] == node]
                await ws.send_json({"type": "lines", "lines": shown, "offset": position})
                continue
            if done:
                await ws.send_json({"type": "end", "offset": position})
                await ws.close()
                return
            # Wait for the next poll, but end at once when the page goes away: an idle tail that
            # never reads would not notice, and would hold the server's shutdown.
            await asyncio.wait({closed}, timeout=POLL_S)
            if closed.done():
                return
    except (WebSocketDisconnect, RuntimeError, ConnectionError):
        return
    finally:
        closed.cancel()


async def _until_closed(ws: WebSocket) -> None:
    """Return when the client closes ``ws`` (pages send nothing, so any other message is ignored)."""
    try:
        while (await ws.receive()).get("type") != "websocket.disconnect":
            pass
    except (WebSocketDisconnect, RuntimeError, ConnectionError):
        return
