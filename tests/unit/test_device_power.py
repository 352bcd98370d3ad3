"""The INA260 reader against a fake SMBus (byte order, scaling, identity) and the fake sensor."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from dit.device import power
from dit.device.common import ConfigError


class FakeBus:
    """Holds INA260 registers as the chip does (16-bit, MSB first on the wire).

    An SMBus word read returns the first byte on the wire as the *low* byte, so a register value
    0xABCD reads back as 0xCDAB — exactly what smbus2's ``read_word_data`` does on a real bus.
    """

    def __init__(self, registers: dict[int, int]) -> None:
        self.registers = registers
        self.reads: list[tuple[int, int]] = []
        self.closed = False

    def read_word_data(self, i2c_addr: int, register: int) -> int:
        self.reads.append((i2c_addr, register))
        if i2c_addr != 0x40:
            raise OSError(121, "Remote I/O error")
        value = self.registers[register]
        msb, lsb = value >> 8, value & 0xFF
        return (lsb << 8) | msb

    def close(self) -> None:
        self.closed = True


def ina260() -> dict[int, int]:
    return {
        power.REG_CONFIG: 0x6127,
        power.REG_CURRENT: 800,  # 800 * 1.25 mA = 1.0 A
        power.REG_VOLTAGE: 4080,  # 4080 * 1.25 mV = 5.1 V
        power.REG_POWER: 510,  # 510 * 10 mW = 5.1 W
        power.REG_MANUFACTURER: 0x5449,
        power.REG_DIE: 0x2270,
    }


def test_swap16_and_signed() -> None:
    assert power.swap16(0x4954) == 0x5449
    assert power.swap16(power.swap16(0x1234)) == 0x1234
    assert power.to_signed16(0xFFFF) == -1
    assert power.to_signed16(0x7FFF) == 0x7FFF


def test_reads_are_byte_swapped_and_scaled() -> None:
    bus = FakeBus(ina260())
    sensor = power.INA260(bus, 0x40)
    identity = sensor.identify()
    assert identity == {"manufacturer_id": 0x5449, "die_id": 0x2270, "config": 0x6127}
    reading = sensor.read()
    assert reading.current_a == pytest.approx(1.0)
    assert reading.voltage_v == pytest.approx(5.1)
    assert reading.power_w == pytest.approx(5.1)
    assert bus.reads[-3:] == [(0x40, 0x01), (0x40, 0x02), (0x40, 0x03)]


def test_current_is_signed() -> None:
    sensor = power.INA260(FakeBus(ina260() | {power.REG_CURRENT: 0x10000 - 8}))
    assert sensor.read().current_a == pytest.approx(-0.01)


def test_a_device_that_is_not_an_ina260_is_refused() -> None:
    bus = FakeBus(ina260() | {power.REG_MANUFACTURER: 0x4954})  # e.g. a forgotten byte swap
    with pytest.raises(power.SensorError, match="manufacturer id 0x4954, expected 0x5449"):
        power.open_sensor({"sensor": "ina260", "host": "d"}, bus_factory=lambda n: bus)
    assert bus.closed
    with pytest.raises(power.SensorError, match="at 0x41: reading register 0xfe"):
        power.open_sensor({"sensor": "ina260", "host": "d", "address": "0x41"}, lambda n: FakeBus(ina260()))


def test_the_i2c_library_is_imported_only_for_the_real_sensor(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_smbus2(name: str, *args: object, **kwargs: object) -> object:
        if name == "smbus2":
            raise ImportError("No module named 'smbus2'")
        return real_import(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(builtins, "__import__", no_smbus2)
    with pytest.raises(power.SensorError, match="needs the smbus2 package"):
        power.open_smbus(1)


def test_fake_sensor_model() -> None:
    assert power.model_power(0.0) == pytest.approx(2.7)
    assert power.model_power(1.0) == pytest.approx(6.4)
    assert power.model_power(0.5) == pytest.approx(4.55)
    assert power.model_power(2.0) == pytest.approx(6.4)
    sensor = power.FakeSensor(lambda: 0.25, idle_w=2.0, active_w=6.0, voltage_v=5.0)
    reading = sensor.read()
    assert reading.power_w == pytest.approx(3.0)
    assert reading.current_a == pytest.approx(0.6)
    assert reading.voltage_v == 5.0


def burn(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def test_node_activity_counts_only_the_processes_of_this_run_and_host() -> None:
    run_id = f"test-power-{os.getpid()}"
    env = {**os.environ, "DIT_RUN_ID": run_id, "DIT_HOST": "device1", "DIT_TAG": "burn"}
    burner = subprocess.Popen(
        [sys.executable, "-c", "import time\nend = time.monotonic() + 3\nwhile time.monotonic() < end: pass"],
        env=env,
    )
    try:
        time.sleep(0.2)
        mine = power.NodeActivity(run_id, "device1", cores=1)
        other_host = power.NodeActivity(run_id, "device2", cores=1)
        other_run = power.NodeActivity("another-run", "device1", cores=1)
        time.sleep(0.8)
        assert mine() > 0.0  # a busy process of this run and host (its share depends on the machine load)
        assert other_host() == 0.0
        assert other_run() == 0.0
    finally:
        burner.kill()
        burner.wait()


def test_run_power_writes_a_trace_from_the_ina260(tmp_path: Path) -> None:
    results = tmp_path / "results"
    bus = FakeBus(ina260())
    cfg = {
        "sensor": "ina260",
        "host": "device1",
        "run_id": "t",
        "results_dir": str(results),
        "interval_s": 0.02,
        "duration_s": 0.2,
        "bus": 1,
        "address": 64,
    }
    assert power.run_power(cfg, bus_factory=lambda n: bus) == 0
    header = json.loads((results / "power.json").read_text())
    assert header["sensor"] == "ina260" and header["manufacturer_id"] == 0x5449 and header["bus"] == 1
    with open(results / "power.csv", encoding="utf-8") as fh:
        table = list(csv.DictReader(fh))
    assert 5 <= len(table) <= 11
    assert {(r["current_a"], r["voltage_v"], r["power_w"]) for r in table} == {
        ("1.00000", "5.10000", "5.1000")
    }
    assert all(int(r["t_mono_ns"]) > header["origin_mono_ns"] for r in table)
    assert bus.closed


def test_run_power_fake_follows_cpu_activity(tmp_path: Path) -> None:
    results = tmp_path / "results"
    cfg = {
        "sensor": "fake",
        "host": "device1",
        "results_dir": str(results),
        "interval_s": 0.1,
        "duration_s": 0.6,
        "fake": {"activity": "system", "idle_w": 2.7, "active_w": 6.4, "voltage_v": 5.1},
    }
    burner = threading.Thread(target=burn, args=(0.8,))
    burner.start()
    try:
        assert power.run_power(cfg) == 0
    finally:
        burner.join()
    with open(results / "power.csv", encoding="utf-8") as fh:
        watts = [float(r["power_w"]) for r in csv.DictReader(fh)]
    assert watts and all(2.7 <= w <= 6.4 for w in watts)
    assert max(watts) > 2.7  # a busy thread raised the utilisation above idle


def test_config_errors() -> None:
    with pytest.raises(ConfigError, match="sensor: 'ina219'"):
        power.open_sensor({"sensor": "ina219", "host": "d"})
    with pytest.raises(ConfigError, match=r"fake\.activity: 'gpu'"):
        power.open_sensor({"sensor": "fake", "host": "d", "fake": {"activity": "gpu"}})
    with pytest.raises(ConfigError, match="address: 'forty'"):
        power.open_sensor({"sensor": "ina260", "host": "d", "address": "forty"}, lambda n: FakeBus(ina260()))
