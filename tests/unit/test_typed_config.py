"""The typed config: built once from the yaml, frozen, its choices the registries' names,
plug-in modules registering new names, keys hybrid lacks refused, no second copy of the
defaults in code below the entry point."""

from __future__ import annotations

import dataclasses
import sys
import textwrap
from pathlib import Path

import pytest

from hybrid.config import ConfigError, HybridConfig, build_config, load_config
from hybrid.core_algos import ADV_ESTIMATOR_REGISTRY
from hybrid.tracking import SUPPORTED_BACKENDS
from reward.manager import REWARD_MANAGER_REGISTRY
from workers.losses import AGG_LOSS_MODES, POLICY_LOSS_REGISTRY


def _kl_kinds():
    from hybrid.config.rules import kl_kinds

    return kl_kinds()


# Each choice key and the registry that implements it (read when called: plug-ins add names).
REGISTRIES = {
    "algorithm.adv_estimator": lambda: tuple(ADV_ESTIMATOR_REGISTRY),
    "actor_rollout_ref.actor.policy_loss.loss_mode": lambda: tuple(POLICY_LOSS_REGISTRY),
    "actor_rollout_ref.actor.loss_agg_mode": lambda: tuple(AGG_LOSS_MODES),
    "actor_rollout_ref.actor.kl_loss_type": _kl_kinds,
    "algorithm.kl_penalty": _kl_kinds,
    "reward_model.reward_manager": lambda: tuple(REWARD_MANAGER_REGISTRY),
    "trainer.logger": lambda: tuple(SUPPORTED_BACKENDS),
}

REPO = Path(__file__).resolve().parents[2]
ARR = "actor_rollout_ref"


def problems_of(overrides: list[str]) -> str:
    with pytest.raises(ConfigError) as info:
        build_config(overrides)
    return str(info.value)


def test_default_config_is_frozen_and_typed():
    config = build_config()
    assert isinstance(config, HybridConfig)
    assert config.actor_rollout_ref.actor.optim.betas == (0.9, 0.999)
    assert config.trainer.logger == ("console", "file")
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.data.train_batch_size = 3  # type: ignore[misc]
    # Interpolations are resolved: the critic's keys follow the actor's.
    assert config.critic.ppo_mini_batch_size == config.actor_rollout_ref.actor.ppo_mini_batch_size
    # The default assets stay placeholders until a run prepares them.
    assert config.actor_rollout_ref.model.path == "hybrid-default:model"


def test_derived_values_are_properties_not_keys():
    config = build_config(
        [
            f"{ARR}.rollout.n=3",
            f"{ARR}.actor.ppo_mini_batch_size=4",
            f"{ARR}.actor.ppo_micro_batch_size_per_gpu=4",
            "data.train_batch_size=8",
        ]
    )
    assert config.actor_rollout_ref.actor.mini_batch_samples == 12
    assert config.actor_rollout_ref.actor.mini_batch_samples_per_rank == 12
    assert config.world_size == 1
    assert config.use_critic is False and config.use_reference_policy is False
    assert build_config(["algorithm.adv_estimator=gae"]).use_critic is True
    steps = config.with_schedule_steps(17)
    assert steps.actor_rollout_ref.actor.optim.total_training_steps == 17
    assert steps.critic.optim.total_training_steps == 17
    assert config.actor_rollout_ref.actor.optim.total_training_steps == -1  # the original is unchanged
    pinned = build_config([f"{ARR}.actor.optim.total_training_steps=5"]).with_schedule_steps(17)
    assert pinned.actor_rollout_ref.actor.optim.total_training_steps == 5


def test_replace_then_run_api_keeps_types():
    config = build_config()
    changed = dataclasses.replace(config, data=dataclasses.replace(config.data, train_batch_size=16))
    assert changed.data.train_batch_size == 16 and config.data.train_batch_size == 8


def test_logger_as_one_name():
    assert build_config(["trainer.logger=console"]).trainer.logger == ("console",)


@pytest.mark.parametrize("key", sorted(REGISTRIES))
def test_every_registered_name_is_accepted(key):
    names = REGISTRIES[key]()
    assert names, key
    for name in names:
        value = f"[{name}]" if key == "trainer.logger" else name
        extra = ["critic.enable=true"] if key == "algorithm.adv_estimator" and name == "gae" else []
        build_config([f"{key}={value}", *extra])


def test_every_default_choice_is_registered():
    config = load_config()
    for key, names in REGISTRIES.items():
        from omegaconf import OmegaConf

        value = OmegaConf.select(config, key)
        values = [value] if isinstance(value, str) else list(value)
        for v in values:
            assert v in names(), f"{key}={v!r} is not in its registry"


def test_literal_choices_exist_where_they_are_implemented():
    """Choices the config lists itself (not from a registry) are each accepted by the code."""
    import torch

    from hybrid.config.schema import DataConfig
    from hybrid.data import TRUNCATION_MODES
    from protocol.config_schema import OneOf, section_fields
    from workers.config import OptimConfig
    from workers.fsdp_utils import build_lr_scheduler

    def choices(cls, name):
        (one_of,) = [e for e in section_fields(cls)[name].__metadata__ if isinstance(e, OneOf)]
        return tuple(one_of.choices())

    assert set(choices(DataConfig, "truncation")) == set(TRUNCATION_MODES)
    optim = build_config().actor_rollout_ref.actor.optim
    for style in choices(OptimConfig, "warmup_style"):
        params = [torch.nn.Parameter(torch.zeros(1))]
        opt = torch.optim.SGD(params, lr=1.0)
        build_lr_scheduler(opt, dataclasses.replace(optim, warmup_style=style), 10)


def test_full_kl_is_refused_with_the_reason():
    message = problems_of([f"{ARR}.actor.kl_loss_type=full", "algorithm.kl_penalty=full"])
    assert (
        f"{ARR}.actor.kl_loss_type='full' is not supported: the 'full' KL needs log-probs over the whole vocabulary"
        in message
    )
    assert "algorithm.kl_penalty='full' is not supported" in message


def test_async_mode_needs_the_vllm_engine_and_the_endpoint_needs_async():
    message = problems_of([f"{ARR}.rollout.mode=async", f"{ARR}.rollout.name=hf"])
    assert (
        f"{ARR}.rollout.mode='async' runs agent loops, which {ARR}.rollout.name='hf' (transformers' generate) does "
        f"not run; set name=vllm or mode=sync" in message
    )
    message = problems_of([f"{ARR}.rollout.agent.enable_http_endpoint=true"])
    assert "enable_http_endpoint=True serves the engine to agent loops" in message
    assert build_config([f"{ARR}.rollout.mode=async"]).actor_rollout_ref.rollout.mode == "async"


@pytest.mark.parametrize(
    "override,needle",
    [
        (f"{ARR}.rollout.agent.custom_async_server.path=my_server.py", "drives its in-process vLLM engine itself"),
        (f"{ARR}.hybrid_engine=false", "set rollout.n_gpus_per_node (and rollout.nnodes) to their count"),
        (f"{ARR}.actor.fsdp_config.fsdp_size=0", "must be -1 (shard over all ranks) or a positive group size"),
        ("trainer.default_hdfs_dir=hdfs://x", "default_local_dir only"),
        ("reward_model.launch_reward_fn_async=true", "computed on the driver"),
        ("data.tokenizer=/some/tokenizer", "tokenizer_path"),
        (f"{ARR}.rollout.load_format=megatron", "FSDP only"),
    ],
)
def test_keys_hybrid_cannot_honour_are_refused(override, needle):
    message = problems_of([override])
    key = override.split("=")[0]
    assert key in message and needle in message


@pytest.mark.parametrize(
    "override,needle",
    [
        (f"{ARR}.rollout.temperature=-0.5", f"{ARR}.rollout.temperature=-0.5 must be a number >= 0"),
        (f"{ARR}.rollout.top_p=0", f"{ARR}.rollout.top_p=0 must be in (0, 1]"),
        (f"{ARR}.rollout.gpu_memory_utilization=1.5", f"{ARR}.rollout.gpu_memory_utilization=1.5 must be in (0, 1]"),
        (f"{ARR}.actor.optim.lr_warmup_steps_ratio=2", f"{ARR}.actor.optim.lr_warmup_steps_ratio=2 must be in [0, 1]"),
        ("algorithm.gamma=1.5", "algorithm.gamma=1.5 must be in [0, 1]"),
        ("trainer.seed=abc", "trainer.seed='abc' must be an integer"),
        (f"{ARR}.rollout.top_k=-5", f"{ARR}.rollout.top_k=-5 must be >= -1"),
        (f"{ARR}.actor.clip_ratio_c=0.5", f"{ARR}.actor.clip_ratio_c=0.5 must be > 1"),
        (f"{ARR}.actor.optim.betas=[0.9,1.5]", f"{ARR}.actor.optim.betas=[0.9, 1.5] must be two numbers in [0, 1)"),
        (f"{ARR}.rollout.stop_token_ids=[-3]", f"{ARR}.rollout.stop_token_ids=[-3]: -3 must be an integer >= 0"),
        ("critic.cliprange_value=-1", "critic.cliprange_value=-1 must be a number >= 0"),
    ],
)
def test_value_ranges(override, needle):
    assert needle in problems_of([override])


def test_added_key_that_nothing_reads_is_refused():
    message = problems_of(["+data.shufle_seed=3"])
    assert "data.shufle_seed: hybrid has no such key and would ignore it" in message


def test_plugin_registers_an_estimator(tmp_path, monkeypatch):
    plugin = tmp_path / "my_estimators.py"
    plugin.write_text(
        textwrap.dedent("""
        from hybrid.core_algos import register_adv_est, get_adv_estimator_fn

        @register_adv_est("grpo_plugin_test")
        def compute(**kwargs):
            return get_adv_estimator_fn("grpo")(**kwargs)
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "my_estimators", raising=False)
    assert "algorithm.adv_estimator='grpo_plugin_test' is not supported" in problems_of(
        ["algorithm.adv_estimator=grpo_plugin_test"]
    )
    config = build_config([f"{ARR}.model.external_lib=my_estimators", "algorithm.adv_estimator=grpo_plugin_test"])
    assert config.algorithm.adv_estimator == "grpo_plugin_test"
    from hybrid.core_algos import ADV_ESTIMATOR_REGISTRY

    ADV_ESTIMATOR_REGISTRY.pop("grpo_plugin_test")


def test_plugin_that_cannot_import_is_named():
    message = problems_of([f"{ARR}.model.external_lib=[no_such_module_xyz]"])
    assert f"{ARR}.model.external_lib: cannot import 'no_such_module_xyz' (ModuleNotFoundError" in message
