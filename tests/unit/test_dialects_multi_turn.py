"""SkyRL's and ROLL's multi-turn keys on hybrid's command line (hybrid/dialects/
skyrl_multi_turn.py, roll_agentic.py): each key's translated overrides onto
actor_rollout_ref.rollout.multi_turn, the refusals with their reasons, translated lines that
pass hybrid's typed-config validation, and the clear failure of an environment whose files
are missing. Nothing here loads a model or calls a network service."""

from __future__ import annotations

from pathlib import Path

import pytest

from hybrid.config import ConfigError, build_config
from hybrid.dialects import translate_argv
from hybrid.dialects.roll import translate_roll
from reward.environments.registry import skyrl_registry
from tests.unit.dialect_helpers import as_dict, skyrl, skyrl_error

REPO = Path(__file__).resolve().parents[2]
ROLL_EXAMPLE = REPO / "examples" / "roll_grpo_arithmetic.yaml"
MT = "actor_rollout_ref.rollout.multi_turn"
needs_skyrl_gym = pytest.mark.skipif(skyrl_registry() is None, reason="skyrl-gym (the env extra) is not installed")


def multi_turn_keys(out: dict) -> dict:
    return {k: v for k, v in out.items() if k.startswith(MT)}


# ---------------------------------------------------------------- SkyRL mappings


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (
            ["generator.max_turns=3"],
            {f"{MT}.enable": True, f"{MT}.max_assistant_turns": 3, f"{MT}.reward_placement": "turn"},
        ),
        # The per-turn budget, and the trajectory's: max_input_length + max_generate_length - max_prompt_length.
        (
            [
                "generator.max_turns=3",
                "generator.sampling_params.max_generate_length=32",
                "generator.max_input_length=256",
                "trainer.max_prompt_length=64",
            ],
            {f"{MT}.max_tokens_per_turn": 32, "data.max_response_length": 224, "data.max_prompt_length": 64},
        ),
        # max_input_length defaults to the prompt length: the trajectory has one turn's budget.
        (
            [
                "generator.max_turns=3",
                "generator.sampling_params.max_generate_length=32",
                "trainer.max_prompt_length=64",
            ],
            {f"{MT}.max_tokens_per_turn": 32, "data.max_response_length": 32},
        ),
        (
            [
                "generator.max_turns=2",
                "generator.max_input_length=100",
                "trainer.max_prompt_length=64",
                "generator.sampling_params.max_generate_length=20",
            ],
            {"data.max_response_length": 56},
        ),
        (
            ["generator.max_turns=2", "generator.use_conversation_multi_turn=false"],
            {f"{MT}.use_conversation_multi_turn": False},
        ),
        (
            ["generator.max_turns=2", "environment.env_class=arithmetic_retry"],
            {f"{MT}.env_class": "arithmetic_retry", f"{MT}.max_assistant_turns": 2},
        ),
        # An environment that is not a single-turn scorer runs as SkyRL runs it: one-turn episodes.
        (
            ["environment.env_class=arithmetic_retry"],
            {f"{MT}.enable": True, f"{MT}.max_assistant_turns": 1, f"{MT}.env_class": "arithmetic_retry"},
        ),
        (
            ["generator.max_turns=4", "environment.env_class=envs/my_env.py:MyEnv"],
            {f"{MT}.env_class": "envs/my_env.py:MyEnv"},
        ),
        (["generator.max_turns=2", "environment.skyrl_gym.max_env_workers=16"], {f"{MT}.env_workers": 16}),
        (["environment.skyrl_gym.max_env_workers=0"], {f"{MT}.env_workers": 1}),
        (
            ["generator.max_turns=2", "environment.skyrl_gym.arithmetic_retry.max_attempts=5"],
            {f"{MT}.env_kwargs.arithmetic_retry.max_attempts": 5},
        ),
        # SkyRL's defaults for the sections skyrl-gym's classes read, around the keys given.
        (
            ["environment.skyrl_gym.search.topk=5"],
            {
                f"{MT}.env_kwargs.search.topk": 5,
                f"{MT}.env_kwargs.search.search_url": "http://127.0.0.1:8000/retrieve",
                f"{MT}.env_kwargs.search.timeout": 30,
                f"{MT}.env_kwargs.search.log_requests": False,
            },
        ),
        (["environment.skyrl_gym.text2sql={db_path:/data/sql}"], {f"{MT}.env_kwargs.text2sql.db_path": "/data/sql"}),
        (
            [
                "generator.max_turns=2",
                "generator.batched=false",
                "generator.append_eos_token_after_stop_str_in_multi_turn=true",
                "generator.step_wise_trajectories=false",
                "generator.sampling_params.max_generate_length=16",
                "generator.eval_sampling_params.max_generate_length=16",
            ],
            # batched=false: SkyRL's per-trajectory agent loop, hybrid's agent loops.
            {f"{MT}.max_tokens_per_turn": 16, "actor_rollout_ref.rollout.mode": "async"},
        ),
        # SkyRL reads append_eos=false only in conversation mode with stop strings.
        (
            ["generator.max_turns=2", "generator.append_eos_token_after_stop_str_in_multi_turn=false"],
            {f"{MT}.enable": True},
        ),
    ],
)
def test_skyrl_multi_turn_mapping(overrides, expected):
    out = skyrl(*overrides)
    for key, value in expected.items():
        assert key in out, (key, out)
        assert out[key] == value, (key, out[key], value)


@needs_skyrl_gym
@pytest.mark.parametrize("name", ["gsm8k_multi_turn", "text2sql", "search", "lcb", "gsm8k"])
def test_skyrl_gym_environments_map_in_multi_turn(name):
    out = skyrl("generator.max_turns=3", f"environment.env_class={name}")
    assert out[f"{MT}.env_class"] == name and out[f"{MT}.enable"] is True


@needs_skyrl_gym
def test_skyrl_text2sql_gets_skyrl_default_db_path_unless_given():
    assert skyrl("generator.max_turns=5", "environment.env_class=text2sql")[f"{MT}.env_kwargs.text2sql.db_path"] == (
        "/home/ray/default/sql_data"
    )
    out = skyrl("generator.max_turns=5", "environment.env_class=text2sql", "environment.skyrl_gym.text2sql.db_path=/d")
    assert out[f"{MT}.env_kwargs.text2sql.db_path"] == "/d"


@pytest.mark.parametrize(
    "overrides",
    [
        ["generator.max_turns=1"],
        [
            "generator.max_turns=1",
            "environment.env_class=gsm8k",
            "generator.use_conversation_multi_turn=false",
            "generator.append_eos_token_after_stop_str_in_multi_turn=false",
            "generator.batched=true",
        ],
        ["environment.env_class=aime", "generator.batched=false"],
        ["generator.step_wise_trajectories=true", "generator.merge_stepwise_output=false"],  # one turn, one sample
    ],
)
def test_skyrl_single_turn_stays_single_turn(overrides):
    out = skyrl(*overrides)
    assert multi_turn_keys(out) == {}


def test_skyrl_single_turn_budgets_are_unchanged():
    out = skyrl(
        "generator.max_input_length=100",
        "generator.sampling_params.max_generate_length=40",
        "generator.eval_sampling_params.max_generate_length=40",
    )
    assert out["data.max_prompt_length"] == 100 and out["data.max_response_length"] == 40
    assert f"{MT}.max_tokens_per_turn" not in out


# ---------------------------------------------------------------- SkyRL refusals


@pytest.mark.parametrize(
    "overrides, reason",
    [
        (["generator.max_turns=3", "generator.batched=true"], "batched generation runs a single turn"),
        (
            [
                "generator.max_turns=2",
                "generator.append_eos_token_after_stop_str_in_multi_turn=false",
                "generator.sampling_params.stop=['</answer>']",
            ],
            "always closes a model turn that did not end with EOS",
        ),
        (
            [
                "generator.max_turns=2",
                "generator.step_wise_trajectories=true",
                "trainer.algorithm.loss_reduction=token_mean_legacy",
            ],
            "SkyRL refuses trainer.algorithm.loss_reduction=token_mean_legacy with step-wise training",
        ),
        (["generator.merge_stepwise_output=true"], "hybrid trains each turn as a sample of its own"),
        (
            ["generator.max_turns=2", "generator.max_input_length=32", "trainer.max_prompt_length=64"],
            "max_input_length 32 is shorter than trainer.max_prompt_length 64",
        ),
        (
            [
                "generator.max_turns=2",
                "generator.sampling_params.max_generate_length=32",
                "generator.eval_sampling_params.max_generate_length=64",
            ],
            "training per-turn budget",
        ),
        (["generator.max_turns=0"], "a whole number >= 1"),
        (["generator.max_turns=two"], "a whole number >= 1"),
        (["environment.skyrl_gym.max_env_workers=-1"], "a whole number >= 0"),
        (["environment.env_class=webshop"], "no environment of that name in hybrid"),
        (["generator.max_turns=2", "environment.env_class=llm_as_a_judge"], "registered by its example's entry point"),
    ],
)
def test_skyrl_multi_turn_refusals(overrides, reason):
    message = skyrl_error(*overrides)
    assert reason in message, message


def test_skyrl_unknown_environment_lists_the_known_ones_and_the_file_form():
    message = skyrl_error("generator.max_turns=2", "environment.env_class=webshop")
    assert "environment.env_class=webshop:" in message
    assert "arithmetic_retry" in message and "path/to/env.py:ClassName" in message


# ---------------------------------------------------------------- SkyRL: typed config


SKYRL_MULTI_TURN_LINE = [
    "--dialect",
    "skyrl",
    "generator.max_turns=3",
    "environment.env_class=arithmetic_retry",
    "generator.sampling_params.max_generate_length=32",
    "generator.max_input_length=160",
    "trainer.max_prompt_length=64",
    "generator.use_conversation_multi_turn=true",
    "generator.batched=false",
    "environment.skyrl_gym.max_env_workers=4",
    "environment.skyrl_gym.arithmetic_retry.max_attempts=3",
    "trainer.train_batch_size=8",
    "trainer.policy_mini_batch_size=4",
    "generator.n_samples_per_prompt=2",
]


def test_skyrl_multi_turn_line_passes_typed_validation():
    cfg = build_config(translate_argv(SKYRL_MULTI_TURN_LINE))
    mt = cfg.actor_rollout_ref.rollout.multi_turn
    assert mt.enable is True and mt.max_assistant_turns == 3 and mt.env_class == "arithmetic_retry"
    assert mt.max_tokens_per_turn == 32 and mt.reward_placement == "turn" and mt.env_workers == 4
    assert mt.use_conversation_multi_turn is True
    assert mt.env_kwargs == {"arithmetic_retry": {"max_attempts": 3}}
    assert cfg.data.max_prompt_length == 64 and cfg.data.max_response_length == 160 + 32 - 64
    assert cfg.actor_rollout_ref.rollout.n == 2
    assert cfg.actor_rollout_ref.rollout.mode == "async"  # generator.batched=false
    assert mt.step_wise_trajectories is False


def test_skyrl_step_wise_line_passes_typed_validation():
    cfg = build_config(translate_argv([*SKYRL_MULTI_TURN_LINE, "generator.step_wise_trajectories=true"]))
    mt = cfg.actor_rollout_ref.rollout.multi_turn
    assert mt.enable is True and mt.step_wise_trajectories is True and mt.reward_placement == "turn"
    assert cfg.actor_rollout_ref.rollout.mode == "async"


@needs_skyrl_gym
def test_skyrl_text2sql_line_validates_and_a_missing_database_fails_clearly(tmp_path):
    from reward.environments import EnvFactory

    cfg = build_config(
        translate_argv(
            [
                "--dialect",
                "skyrl",
                "generator.max_turns=5",
                "environment.env_class=text2sql",
                f"environment.skyrl_gym.text2sql.db_path={tmp_path}",
            ]
        )
    )
    factory = EnvFactory(cfg.actor_rollout_ref.rollout.multi_turn)
    row = {"db_id": "shop", "data": "spider", "reward_spec": {"ground_truth": "SELECT 1"}}
    with pytest.raises(FileNotFoundError, match=r"Database file not found at: .*shop\.sqlite"):
        factory.make(row)


@needs_skyrl_gym
def test_skyrl_search_environment_is_built_with_skyrl_defaults_and_no_network_call():
    from reward.environments import EnvFactory

    cfg = build_config(
        translate_argv(
            [
                "--dialect",
                "skyrl",
                "generator.max_turns=2",
                "environment.env_class=search",
                "environment.skyrl_gym.search.topk=5",
            ]
        )
    )
    env = EnvFactory(cfg.actor_rollout_ref.rollout.multi_turn).make({"reward_spec": {"ground_truth": "x"}})
    assert env.tool_group.search_url == "http://127.0.0.1:8000/retrieve" and env.tool_group.topk == 5


# ---------------------------------------------------------------- ROLL


ROLL_ENVS = """\
max_actions_per_traj: 4
max_tokens_per_step: 64
env_manager_cls: roll.pipeline.agentic.env_manager.traj_env_manager.TrajEnvManager
custom_envs:
  Retry:
    env_type: arithmetic_retry
    max_steps: ${max_actions_per_traj}
    max_tokens_per_step: ${max_tokens_per_step}
    env_manager_cls: ${env_manager_cls}
    use_thread_lock: true
    max_env_step_concurrent: 6
    env_config:
      max_attempts: ${max_actions_per_traj}
  SimpleSokoban:
    env_type: sokoban
    max_steps: 10
    agent_template: "Turn {turn_idx}: {observation}"
train_env_manager:
  tags: [Retry]
val_env_manager:
  tags: [Retry]
reward_normalization:
  grouping: traj_group_id
  method: mean_std
"""


def roll_file(tmp_path: Path, text: str) -> Path:
    """ROLL's example pipeline with `text` appended (its top-level keys are new)."""
    path = tmp_path / "agentic.yaml"
    path.write_text(ROLL_EXAMPLE.read_text() + "\n" + text)
    return path


def roll(tmp_path: Path, text: str, *overrides: str) -> dict:
    return as_dict(translate_roll(str(roll_file(tmp_path, text)), list(overrides)))


def roll_error(tmp_path: Path, text: str, *overrides: str) -> str:
    with pytest.raises(ConfigError) as err:
        translate_roll(str(roll_file(tmp_path, text)), list(overrides))
    return str(err.value)


def test_roll_custom_envs_map_onto_multi_turn(tmp_path):
    out = roll(tmp_path, ROLL_ENVS, "max_steps=7")
    assert multi_turn_keys(out) == {
        f"{MT}.enable": True,
        f"{MT}.env_class": "arithmetic_retry",
        f"{MT}.max_assistant_turns": 4,
        f"{MT}.max_tokens_per_turn": 48,  # min(max_tokens_per_step 64, the example's max_new_tokens 48)
        f"{MT}.env_workers": 6,
        f"{MT}.env_kwargs.arithmetic_retry.max_attempts": 4,
    }
    # The pipeline's max_steps is still the number of training steps; the unlisted
    # SimpleSokoban section (a GEM environment, with a template) is not read.
    assert out["trainer.total_training_steps"] == 7


def test_roll_without_tags_reads_every_section(tmp_path):
    text = "custom_envs:\n  Retry:\n    env_type: arithmetic_retry\n    max_steps: 2\n"
    out = roll(tmp_path, text, "+reward_normalization.method=mean_std", "+reward_normalization.grouping=traj_group_id")
    assert out[f"{MT}.max_assistant_turns"] == 2 and out[f"{MT}.env_class"] == "arithmetic_retry"


@pytest.mark.parametrize(
    "overrides, reason",
    [
        (
            ["train_env_manager.tags=[SimpleSokoban]", "+train_env_manager.group_size=2"],
            "train_env_manager's episodes come from seeds and val_env_manager's from the data files' rows",
        ),
        (["+custom_envs.Retry.agent_template=Turn"], "renders each observation into a prompt"),
        (["custom_envs.SimpleSokoban.env_type=webshop", "train_env_manager.tags=[SimpleSokoban]"], "'webshop'"),
        (
            ["train_env_manager.tags=[SimpleSokoban]"],
            "both set actor_rollout_ref.rollout.multi_turn.max_assistant_turns",
        ),
        (["train_env_manager.tags=[Missing]"], "no custom_envs section for Missing"),
        (["+train_env_manager.num_env_groups=8"], "environment-driven rollout"),
        (["+train_env_manager.group_size=8"], "environment-driven rollout"),
        (
            ["custom_envs.Retry.env_manager_cls=roll.pipeline.agentic.env_manager.step_env_manager.StepEnvManager"],
            "one sample per trajectory",
        ),
        (["+custom_envs.Retry.agent_system_template=You play."], "return the chat messages themselves"),
        (["+custom_envs.Retry.frobnicate=1"], "an environment setting hybrid has no key for"),
        (["custom_envs.Retry.max_steps=0"], "a whole number >= 1"),
        (["adv_estimator=gigpo"], "step-wise estimator"),
        (["+ratio_type=segment"], "per token"),
        (["reward_normalization.grouping=tags"], "hybrid's groups are the episodes of one seed row"),
        (["adv_estimator=gae"], "no key to normalise rewards before GAE"),
        (["reward_normalization.method=identity"], "not this combination"),
    ],
)
def test_roll_agentic_refusals(tmp_path, overrides, reason):
    message = roll_error(tmp_path, ROLL_ENVS, *overrides)
    assert reason in message, message


def test_roll_env_config_needs_its_env_type(tmp_path):
    text = "custom_envs:\n  Bare:\n    max_steps: 2\n    env_config:\n      level: 3\n"
    assert "needs custom_envs.Bare.env_type" in roll_error(tmp_path, text)


def test_roll_agentic_line_passes_typed_validation(tmp_path):
    path = roll_file(tmp_path, ROLL_ENVS)
    cfg = build_config(translate_argv(["--roll-config", str(path), "max_steps=3"]))
    mt = cfg.actor_rollout_ref.rollout.multi_turn
    assert mt.enable is True and mt.env_class == "arithmetic_retry"
    assert mt.max_assistant_turns == 4 and mt.max_tokens_per_turn == 48 and mt.env_workers == 6
    assert mt.env_kwargs == {"arithmetic_retry": {"max_attempts": 4}}
    assert cfg.trainer.total_training_steps == 3
