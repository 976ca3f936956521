"""SkyRL's `generator.vision_language_generator=true` (hybrid/dialects/skyrl_vision.py): SkyRL's
geometry3k and VisGym launch lines (as extracted into tests/data/peer_examples/skyrl.json, with
the environment their entry module registers) compose into hybrid's multi-turn loop, which
carries images for a vision-language policy; SkyRL's own refusals of that generator; the VisGym
entry module's environment read from its --env_variant flag. Nothing here loads a model."""

from __future__ import annotations

import json

import pytest

from hybrid.config import build_config
from hybrid.dialects import translate_argv
from scripts.peer_examples.skyrl import registrations
from tests.unit.dialect_helpers import REPO, skyrl_error

EXAMPLES = REPO / "tests" / "data" / "peer_examples" / "skyrl.json"


def _example_argv(path: str) -> list[str]:
    """The script's key=value arguments, environment.env_class as its entry module registers it."""
    example = next(e for e in json.loads(EXAMPLES.read_text())["examples"] if e["path"] == path)
    argv = []
    for arg in example["argv"]:
        key, _, value = arg.partition("=")
        value = value.strip("'\"")
        argv.append(f"{key}={example['registers'].get(value, value)}" if key == "environment.env_class" else arg)
    return argv


@pytest.mark.parametrize(
    "path, env_class, turns",
    [
        ("examples/train/geometry3k/run_geometry3k.sh", "examples.train.geometry3k.env:Geometry3kEnv", 3),
    ],
)
def test_skyrl_vision_examples_compose_to_the_multi_turn_loop(path, env_class, turns):
    # (the VisGym scripts set engine_init_kwargs, whose check imports vLLM: 5 s each; the count script
    # composes them, scripts/count_peer_examples.py)
    cfg = build_config(translate_argv(["--dialect", "skyrl", *_example_argv(path)]))
    rollout = cfg.actor_rollout_ref.rollout
    mt = rollout.multi_turn
    assert mt.enable is True and mt.env_class == env_class and mt.reward_placement == "turn"
    assert mt.use_conversation_multi_turn is True and mt.step_wise_trajectories is False
    if turns is not None:
        assert mt.max_assistant_turns == turns
    # SkyRL's per-trajectory agent loop (batched=false) runs in the lock-step loop, which carries images.
    assert rollout.mode == "sync" and rollout.name == "vllm"


def test_geometry3k_budgets():
    cfg = build_config(
        translate_argv(["--dialect", "skyrl", *_example_argv("examples/train/geometry3k/run_geometry3k.sh")])
    )
    # max_prompt_length 1024, max_generate_length 2048, no max_input_length: SkyRL's input limit is the prompt's.
    assert cfg.data.max_prompt_length == 1024 and cfg.data.max_response_length == 2048
    assert cfg.actor_rollout_ref.rollout.multi_turn.max_tokens_per_turn == 2048


@pytest.mark.parametrize(
    "extra, reason",
    [
        ("generator.batched=true", "SkyRL's vision-language generator refuses generator.batched=true"),
        ("generator.step_wise_trajectories=true", "refuses generator.step_wise_trajectories=true"),
        ("generator.use_conversation_multi_turn=false", "requires generator.use_conversation_multi_turn=true"),
        ("generator.vision_language_generator=yes", "generator.vision_language_generator=yes: true or false"),
    ],
)
def test_skyrl_vision_generator_refusals(extra, reason):
    line = ["generator.vision_language_generator=true", "generator.max_turns=2", extra]
    assert reason in skyrl_error(*line)


def test_visgym_entry_point_read_from_its_flag():
    source = (
        "_ENV_ENTRY_POINTS = {'sft': 'm.env_sft:VisGymEnv', 'instruct': 'm.env_instruct:VisGymEnv'}\n"
        "def run(cfg, env_variant):\n"
        "    register(id='visgym', entry_point=_ENV_ENTRY_POINTS[env_variant])\n"
        "    register(id='plain', entry_point='m.plain:Env')\n"
    )
    assert registrations(source, ["--env_variant", "sft"]) == {"visgym": "m.env_sft:VisGymEnv", "plain": "m.plain:Env"}
    assert registrations(source, ["--env_variant=instruct"])["visgym"] == "m.env_instruct:VisGymEnv"
    assert registrations(source, []) == {"plain": "m.plain:Env"}  # unread: the check says so
    kept = {e["path"]: e.get("registers") for e in json.loads(EXAMPLES.read_text())["examples"]}
    for variant in ("instruct", "sft"):
        registered = kept[f"examples/train/visgym/run_visgym_from_{variant}.sh"]
        assert registered == {"visgym": f"examples.train.visgym.env_{variant}:VisGymEnv"}


def test_a_missing_dependency_of_an_environment_module_is_named(tmp_path, monkeypatch):
    from reward.environments.registry import get_env_cls

    (tmp_path / "visgym_like.py").write_text(
        "import not_installed_gymnasium_fork\nclass Env:\n    def step(self, a): ...\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ImportError) as err:
        get_env_cls("visgym_like:Env")
    assert str(err.value).startswith(
        "actor_rollout_ref.rollout.multi_turn.env_class: module 'visgym_like' imports 'not_installed_gymnasium_fork', "
        "which is not installed; install it"
    )
