"""dit.device.common: the one builder of a stage model from its spec."""

from __future__ import annotations

import re

import pytest

from dit.device.common import ConfigError, build_model
from dit.device.fakemodel import FakeModel
from tests.conftest import REPO


def test_one_build_model_serves_the_device_commands_and_the_controller() -> None:
    definitions = [
        str(path.relative_to(REPO))
        for path in sorted((REPO / "src" / "dit").rglob("*.py"))
        if re.search(r"^def build_model\(", path.read_text(encoding="utf-8"), re.M)
    ]
    assert definitions == ["src/dit/device/common.py"]


def test_a_spec_names_its_builder_or_is_the_fake_model() -> None:
    explicit = build_model({"name": "fake", "builder": "dit.device.fakemodel:build", "seed": 3})
    default = build_model({"name": "fake", "seed": 3})
    assert isinstance(explicit, FakeModel) and isinstance(default, FakeModel)
    assert explicit.make_input() == default.make_input()
    with pytest.raises(ConfigError, match=r"model.builder: is required for model 'vgg16'"):
        build_model({"name": "vgg16"})
