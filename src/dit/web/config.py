"""NNPM's settings (``dit web``'s options): what the app and every router read from one :class:`WebConfig`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dit.web.security import TOKEN_ENV, is_loopback, new_token, token_problem


@dataclass
class WebConfig:
    host: str = "127.0.0.1"
    port: int = 8765
    inventory: Path = Path("inventories/nnpm.yml")
    runs_dir: Path = Path("runs")
    scenarios_dir: Path = Path("scenarios")
    tiles: str | None = None  # None: the map is a floor plan; else a URL template, tile dir or .mbtiles
    tiles_attribution: str = "© OpenStreetMap contributors"
    probe: str = "auto"
    db: Path | None = None  # default: <runs_dir>/.nnpm/nnpm.sqlite
    token: str | None = None  # None: a random one per start, unless no_token
    no_token: bool = False  # loopback only: every local user can then drive NNPM
    map_center: tuple[float, float] = (37.9838, 23.7275)  # Athens
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def exposed(self) -> bool:
        return not is_loopback(self.host)

    def ensure_token(self) -> str | None:
        """The token every request needs (made here when none is given); None with ``no_token``.

        :class:`ValueError` naming the option when ``no_token`` is asked for on a non-loopback bind, or
        with a token, or when the given token is unfit.
        """
        if self.no_token:
            if self.exposed:
                raise ValueError(
                    f"--no-token: NNPM bound to {self.host} would be open to the network; "
                    "it is only for a loopback --host (127.0.0.1, ::1)"
                )
            if self.token:
                raise ValueError(f"--no-token: {TOKEN_ENV} gives a token as well; unset one of them")
            return None
        if self.token is None:
            self.token = new_token()
        problem = token_problem(self.token)
        if problem:
            raise ValueError(f"{TOKEN_ENV}: {problem}")
        return self.token
