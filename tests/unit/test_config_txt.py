"""The config.txt builder of roles/provision_cmdline (I2C for the INA260, issue 10 item 10): pure and idempotent."""

from __future__ import annotations

import importlib.util
from types import ModuleType

import pytest

from tests.conftest import REPO

# The head and tail of Raspberry Pi OS bookworm's stock /boot/firmware/config.txt.
STOCK = """\
# For more options and information see
# http://rptl.io/configtxt
# Some settings may impact device functionality. See link above for details

# Uncomment some or all of these to enable the optional hardware interfaces
#dtparam=i2c_arm=on
#dtparam=i2s=on
#dtparam=spi=on

# Enable audio (loads snd_bcm2835)
dtparam=audio=on

# Run in 64-bit mode
arm_64bit=1

[cm4]
# Enable host mode on the 2711 built-in XHCI USB controller.
otg_mode=1

[all]
"""


def load() -> ModuleType:
    path = REPO / "roles/provision_cmdline/filter_plugins/config_txt.py"
    spec = importlib.util.spec_from_file_location("config_txt", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


I2C = ["dtparam=i2c_arm=on"]


def test_the_stock_commented_line_is_enabled_in_place_and_nothing_else_changes() -> None:
    build = load().config_txt
    out = build(STOCK, I2C)
    assert out == STOCK.replace("#dtparam=i2c_arm=on", "dtparam=i2c_arm=on")
    assert build(out, I2C) == out  # idempotent: the role writes nothing the second time
    module = load()
    assert module.FilterModule().filters()["dit_config_txt"] is module.config_txt


def test_a_setting_to_another_value_is_rewritten_wherever_it_is() -> None:
    build = load().config_txt
    text = "dtparam=audio=on,i2c_arm=off\n[pi4]\ndtparam=i2c_arm=off  # no I2C\n"
    out = build(text, I2C)
    assert out == "dtparam=audio=on,i2c_arm=on\n[pi4]\ndtparam=i2c_arm=on\n"
    assert build(out, I2C) == out
    assert build("dtparam=i2c_arm\n", I2C) == "dtparam=i2c_arm\n"  # a bare parameter means on


def test_a_missing_setting_is_appended_for_every_board() -> None:
    build = load().config_txt
    assert build("arm_64bit=1\n", I2C) == "arm_64bit=1\ndtparam=i2c_arm=on\n"
    # the file ends in a filtered section: the line must not apply to [cm4] alone
    out = build("arm_64bit=1\n[cm4]\notg_mode=1\n", I2C)
    assert out == "arm_64bit=1\n[cm4]\notg_mode=1\n[all]\ndtparam=i2c_arm=on\n"
    assert build(out, I2C) == out
    # set only for one board: the line for every board is still added
    assert (
        build("[pi4]\ndtparam=i2c_arm=on\n", I2C) == "[pi4]\ndtparam=i2c_arm=on\n[all]\ndtparam=i2c_arm=on\n"
    )
    assert build("", ["enable_uart=1"]) == "enable_uart=1\n"
    assert build("enable_uart=0\n", "enable_uart=1") == "enable_uart=1\n"


@pytest.mark.parametrize("bad", ["i2c", "dtparam=i2c_arm", "dtparam=a=1,b=2", " x=1", "=1"])
def test_a_malformed_setting_is_refused_by_name(bad: str) -> None:
    with pytest.raises(ValueError, match=r"config\.txt setting"):
        load().config_txt("", [bad])
