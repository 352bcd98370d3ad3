"""Power traces: the ``power`` device command (stdlib only; the I2C library is imported lazily).

Sensors (config ``sensor``):

``ina260``
    A TI INA260 on I2C bus ``bus`` (1 on a Pi) at ``address`` (0x40 by default), read through
    `smbus2 <https://pypi.org/project/smbus2/>`_ (imported only when this sensor is used). Registers are
    big-endian 16-bit words; an SMBus word read is little-endian, so every read is byte-swapped
    (:func:`swap16`). At start the manufacturer id (0xFE) must read 0x5449 ("TI"), else the command fails.
    Current 0x01 (signed, 1.25 mA/LSB), bus voltage 0x02 (1.25 mV/LSB), power 0x03 (10 mW/LSB). The sensor's
    configuration is read, never written (power-on default: continuous, 1.1 ms conversions, no averaging).

``fake``
    A model for local mode: ``P = idle_w + (active_w - idle_w) * u`` with ``u`` the CPU utilisation over the
    last interval, in 0..1, and ``I = P / voltage_v``. Defaults are Raspberry Pi 4 figures: 2.7 W idle,
    6.4 W with every core busy, 5.1 V supply. ``activity`` says whose CPU ``u`` measures:
    ``system`` — the whole machine (``/proc/stat``; what a board's supply sees); ``node`` — the processes of
    this run and host (``DIT_RUN_ID``/``DIT_HOST`` in their environment; rescanned every second, utime +
    stime from ``/proc/<pid>/stat``) divided by ``cores`` (4, a Pi 4), which is what local mode uses so that
    each directory-node draws power for its own work only.

It writes ``power.csv`` (``results_dir``): ``t_mono_ns,current_a,voltage_v,power_w`` every ``interval_s``
(0.1 s), flushed per row, and ``power.json`` (origin pair, sensor, identity, model parameters).
"""

from __future__ import annotations

import csv
import importlib
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol

from dit.device.common import ConfigError, Origin, require, write_json
from dit.device.monitor import read_proc_stat, utilisation_pct
from dit.device.sampling import StopSignal, deadline_ns, every
from dit.device.tags import HOST_ENV, RUN_ENV

INA260_ADDRESS: Final = 0x40
REG_CONFIG: Final = 0x00
REG_CURRENT: Final = 0x01
REG_VOLTAGE: Final = 0x02
REG_POWER: Final = 0x03
REG_MANUFACTURER: Final = 0xFE
REG_DIE: Final = 0xFF
MANUFACTURER_ID: Final = 0x5449  # "TI"
CURRENT_LSB_A: Final = 0.00125
VOLTAGE_LSB_V: Final = 0.00125
POWER_LSB_W: Final = 0.010
PI4_IDLE_W: Final = 2.7
PI4_ACTIVE_W: Final = 6.4
PI4_SUPPLY_V: Final = 5.1
CSV_COLUMNS: Final = ("t_mono_ns", "current_a", "voltage_v", "power_w")


class SensorError(RuntimeError):
    """The sensor is missing, answers wrongly, or is not the expected part."""


class I2CBus(Protocol):
    def read_word_data(self, i2c_addr: int, register: int) -> int: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Reading:
    current_a: float
    voltage_v: float
    power_w: float


def swap16(word: int) -> int:
    """Swap the two bytes of an SMBus word (little-endian on the wire order) into the INA260's order."""
    return ((word & 0xFF) << 8) | ((word >> 8) & 0xFF)


def to_signed16(value: int) -> int:
    return value - 0x10000 if value & 0x8000 else value


def open_smbus(bus: int) -> I2CBus:
    """``smbus2.SMBus(bus)``, imported here so that nothing else needs the library."""
    try:
        smbus2 = importlib.import_module("smbus2")
    except ImportError as exc:
        raise SensorError(
            "the ina260 sensor needs the smbus2 package (pinned in requirements/device.txt: "
            "run playbooks/provision.yml, or pip install smbus2)"
        ) from exc
    try:
        handle: I2CBus = smbus2.SMBus(bus)
    except OSError as exc:
        raise SensorError(
            f"cannot open I2C bus {bus}: {exc} (is I2C enabled? playbooks/provision.yml sets "
            "dtparam=i2c_arm=on in /boot/firmware/config.txt; it takes effect after a reboot)"
        ) from exc
    return handle


class INA260:
    def __init__(self, bus: I2CBus, address: int = INA260_ADDRESS) -> None:
        self.bus = bus
        self.address = address

    def register(self, reg: int) -> int:
        try:
            return swap16(self.bus.read_word_data(self.address, reg))
        except OSError as exc:
            raise SensorError(f"INA260 at 0x{self.address:02x}: reading register 0x{reg:02x}: {exc}") from exc

    def identify(self) -> dict[str, int]:
        """Check the manufacturer id; returns the identity registers."""
        manufacturer = self.register(REG_MANUFACTURER)
        if manufacturer != MANUFACTURER_ID:
            raise SensorError(
                f"device at 0x{self.address:02x} is not an INA260: manufacturer id 0x{manufacturer:04x}, "
                f"expected 0x{MANUFACTURER_ID:04x}"
            )
        return {
            "manufacturer_id": manufacturer,
            "die_id": self.register(REG_DIE),
            "config": self.register(REG_CONFIG),
        }

    def read(self) -> Reading:
        current = to_signed16(self.register(REG_CURRENT)) * CURRENT_LSB_A
        voltage = self.register(REG_VOLTAGE) * VOLTAGE_LSB_V
        power = self.register(REG_POWER) * POWER_LSB_W
        return Reading(current, voltage, power)

    def close(self) -> None:
        self.bus.close()


def model_power(u: float, idle_w: float = PI4_IDLE_W, active_w: float = PI4_ACTIVE_W) -> float:
    """The fake sensor's model: ``idle + (active - idle) * u`` with ``u`` clamped to 0..1."""
    return idle_w + (active_w - idle_w) * min(max(u, 0.0), 1.0)


class SystemActivity:
    """Whole-machine CPU utilisation (0..1) since the previous call, from ``/proc/stat``."""

    def __init__(self, proc_stat: Path = Path("/proc/stat")) -> None:
        self.path = proc_stat
        self.prev = read_proc_stat(proc_stat)["cpu"]
        self.last = 0.0

    def __call__(self) -> float:
        now = read_proc_stat(self.path)["cpu"]
        pct = utilisation_pct(self.prev, now)
        self.prev = now
        if pct is not None:
            self.last = pct / 100.0
        return self.last


def _tag_of(pid: str) -> tuple[str | None, str | None]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            raw = fh.read()
    except OSError:
        return None, None
    run = host = None
    for item in raw.split(b"\0"):
        name, _, value = item.partition(b"=")
        if name == RUN_ENV.encode():
            run = value.decode("utf-8", "replace")
        elif name == HOST_ENV.encode():
            host = value.decode("utf-8", "replace")
    return run, host


def _cpu_ticks(pid: str) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2 :].split()
    return int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of the whole line)


class NodeActivity:
    """CPU utilisation (0..1 of ``cores``) of the processes tagged with this run and host."""

    def __init__(self, run_id: str, host: str, cores: int, rescan_s: float = 1.0) -> None:
        self.run_id, self.host, self.cores = run_id, host, cores
        self.rescan_ns = round(rescan_s * 1e9)
        self.hz = os.sysconf("SC_CLK_TCK")
        self.known: dict[str, bool] = {}  # pid -> tagged with this run and host
        self.ticks: dict[str, int] = {}
        self.next_scan = 0
        self.prev_ns = time.monotonic_ns()
        self.last = 0.0
        self._scan()
        self._sum()

    def _scan(self) -> None:
        pids = {name for name in os.listdir("/proc") if name.isdigit()}
        for pid in list(self.known):
            if pid not in pids:
                del self.known[pid]
                self.ticks.pop(pid, None)
        for pid in pids - self.known.keys():
            self.known[pid] = _tag_of(pid) == (self.run_id, self.host)
        self.next_scan = time.monotonic_ns() + self.rescan_ns

    def _sum(self) -> int:
        delta = 0
        for pid, mine in self.known.items():
            if not mine:
                continue
            ticks = _cpu_ticks(pid)
            if ticks is None:
                continue
            delta += ticks - self.ticks.get(pid, ticks)
            self.ticks[pid] = ticks
        return delta

    def __call__(self) -> float:
        if time.monotonic_ns() >= self.next_scan:
            self._scan()
        delta = self._sum()
        now = time.monotonic_ns()
        elapsed_s = (now - self.prev_ns) / 1e9
        self.prev_ns = now
        if elapsed_s > 0:
            self.last = min(1.0, delta / self.hz / elapsed_s / self.cores)
        return self.last


class FakeSensor:
    def __init__(
        self,
        activity: Any,
        idle_w: float = PI4_IDLE_W,
        active_w: float = PI4_ACTIVE_W,
        voltage_v: float = PI4_SUPPLY_V,
    ) -> None:
        self.activity = activity
        self.idle_w, self.active_w, self.voltage_v = idle_w, active_w, voltage_v

    def read(self) -> Reading:
        power = model_power(float(self.activity()), self.idle_w, self.active_w)
        return Reading(current_a=power / self.voltage_v, voltage_v=self.voltage_v, power_w=power)

    def close(self) -> None:
        pass


# --------------------------------------------------------------------------- the command


def _float(cfg: Mapping[str, Any], key: str, default: float, minimum: float = 0.0) -> float:
    value = cfg.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < minimum:
        raise ConfigError(f"{key}: {value!r} is not a number >= {minimum}")
    return float(value)


def _int(cfg: Mapping[str, Any], key: str, default: int) -> int:
    value = cfg.get(key, default)
    if isinstance(value, str):
        try:
            value = int(value, 0)  # "0x40"
        except ValueError as exc:
            raise ConfigError(f"{key}: {value!r} is not an integer") from exc
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{key}: {value!r} is not a non-negative integer")
    return value


def open_sensor(cfg: Mapping[str, Any], bus_factory: Any = open_smbus) -> tuple[Any, dict[str, Any]]:
    """The sensor a config names and what ``power.json`` records about it."""
    kind = str(require(cfg, "sensor", str))
    if kind == "ina260":
        bus_no, address = _int(cfg, "bus", 1), _int(cfg, "address", INA260_ADDRESS)
        sensor = INA260(bus_factory(bus_no), address)
        try:
            identity = sensor.identify()
        except SensorError:
            sensor.close()
            raise
        return sensor, {"sensor": "ina260", "bus": bus_no, "address": address, **identity}
    if kind == "fake":
        fake: Mapping[str, Any] = cfg.get("fake") or {}
        idle = _float(fake, "idle_w", PI4_IDLE_W)
        active = _float(fake, "active_w", PI4_ACTIVE_W)
        volts = _float(fake, "voltage_v", PI4_SUPPLY_V, minimum=1e-3)
        mode = str(fake.get("activity", "system"))
        if mode == "system":
            activity: Any = SystemActivity()
            cores = os.cpu_count() or 1
        elif mode == "node":
            cores = _int(fake, "cores", 4) or 1
            activity = NodeActivity(str(cfg.get("run_id", "")), str(require(cfg, "host", str)), cores)
        else:
            raise ConfigError(f"fake.activity: {mode!r} is not one of system, node")
        model = {"idle_w": idle, "active_w": active, "voltage_v": volts, "activity": mode, "cores": cores}
        return FakeSensor(activity, idle, active, volts), {"sensor": "fake", "model": model}
    raise ConfigError(f"sensor: {kind!r} is not one of ina260, fake")


def run_power(cfg: Mapping[str, Any], bus_factory: Any = open_smbus) -> int:
    """The ``power`` command (see the module docstring and ``docs/protocol.md``)."""
    host = str(require(cfg, "host", str))
    run_id = str(cfg.get("run_id", ""))
    results = Path(require(cfg, "results_dir", str))
    interval_s = _float(cfg, "interval_s", 0.1, minimum=1e-3)
    raw_duration = cfg.get("duration_s")
    duration = float(raw_duration) if isinstance(raw_duration, int | float) else None
    results.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault(RUN_ENV, run_id)
    with StopSignal() as stop:
        sensor, about = open_sensor(cfg, bus_factory)
        try:
            _trace(sensor, about, cfg, host, run_id, results, interval_s, duration, stop)
        finally:
            sensor.close()
    return 0


def _trace(
    sensor: Any,
    about: dict[str, Any],
    cfg: Mapping[str, Any],
    host: str,
    run_id: str,
    results: Path,
    interval_s: float,
    duration: float | None,
    stop: StopSignal,
) -> None:
    origin = Origin.now()
    write_json(
        results / "power.json",
        {
            "host": host,
            "run_id": run_id,
            "pid": os.getpid(),
            "origin_wall_ns": origin.wall_ns,
            "origin_mono_ns": origin.mono_ns,
            "interval_s": interval_s,
            "columns": list(CSV_COLUMNS),
            **about,
        },
    )
    with open(results / "power.csv", "w", encoding="utf-8", newline="") as fh:
        writer = csv.writer(fh, lineterminator="\n")
        writer.writerow(CSV_COLUMNS)
        fh.flush()
        ready = cfg.get("ready_file")
        if ready:
            write_json(Path(str(ready)), {"host": host, "pid": os.getpid(), "sensor": about["sensor"]})

        def sample() -> None:
            reading = sensor.read()
            writer.writerow(
                [
                    time.monotonic_ns(),
                    f"{reading.current_a:.5f}",
                    f"{reading.voltage_v:.5f}",
                    f"{reading.power_w:.4f}",
                ]
            )
            fh.flush()

        every(stop, origin.mono_ns, round(interval_s * 1e9), deadline_ns(origin.mono_ns, duration), sample)
