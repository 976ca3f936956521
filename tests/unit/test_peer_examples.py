"""What the peers' own example scripts need beyond their documented keys: a logger package
missing is refused before anything starts, in one line."""

from __future__ import annotations

import importlib.util

import pytest

from hybrid.config import build_config
from hybrid.errors import InputError
from hybrid.preflight import check_inputs
from hybrid.tracking import missing_logger_packages


def test_a_logger_whose_package_is_missing_is_refused_before_anything_starts(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    assert missing_logger_packages(["console", "file"]) == []
    (message,) = missing_logger_packages(["console", "wandb", "wandb"])
    assert message == (
        "trainer.logger includes 'wandb' but the package 'wandb' is not installed: pip install wandb "
        "(or the loggers extra, pip install -e '.[loggers]'), or remove 'wandb' from trainer.logger"
    )
    with pytest.raises(InputError) as err:
        check_inputs(build_config(["trainer.logger=[console,wandb]"]))
    assert err.value.problems == [message]
    assert str(err.value) == message  # one line
