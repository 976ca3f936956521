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


def test_a_json_dict_on_the_command_line_is_read_or_refused_in_one_line():
    from hybrid.config import ConfigError
    from hybrid.dialects import translate_argv

    # SkyRL's launch scripts: engine_init_kwargs="$ENGINE_INIT_KWARGS" holding a JSON object
    argv = translate_argv(
        ["--dialect", "skyrl", 'generator.inference_engine.engine_init_kwargs={"max_model_len": 4096, "x": [1, 2]}']
    )
    config = build_config(argv)
    assert config.actor_rollout_ref.rollout.engine_kwargs.vllm == {"max_model_len": 4096, "x": [1, 2]}
    # the same in verl keys, and Hydra's own grammar for a whole free-form dict
    for value in ('{"swap_space": 4}', "{swap_space: 4}"):
        vllm = build_config([f"actor_rollout_ref.rollout.engine_kwargs.vllm={value}"]).actor_rollout_ref.rollout
        assert vllm.engine_kwargs.vllm == {"swap_space": 4}
    for argv in (
        ["--dialect", "skyrl", 'generator.inference_engine.engine_init_kwargs={"a": 1'],
        ['actor_rollout_ref.rollout.engine_kwargs.vllm={"a": 1'],
    ):
        with pytest.raises(ConfigError) as err:
            build_config(translate_argv(argv))
        (line,) = [x for x in str(err.value).splitlines() if "engine" in x]
        assert "is neither Hydra's grammar" in line and "nor JSON" in line
