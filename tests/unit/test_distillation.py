"""On-policy distillation (hybrid/distillation.py): the teacher's grades and the no_op estimator
against numbers worked out by hand, the trainer's reward step with them, the config rules and
the teacher's vocabulary check in one line each, and SkyRL's two distillation examples read
through the SkyRL dialect."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from hybrid.config import ConfigError, build_config
from hybrid.core_algos import get_adv_estimator_fn
from hybrid.distillation import distillation_rewards, teacher_vocabulary_problem
from hybrid.trainer import PPOTrainer
from protocol.data_proto import DataProto

REPO = Path(__file__).resolve().parents[2]
TEACHER = "actor_rollout_ref.ref.model.path"
DISTILL = ["algorithm.on_policy_distillation=true", "algorithm.adv_estimator=no_op", f"{TEACHER}=/models/teacher"]

# Two responses of three tokens; the second one's last token is padding (its teacher log-prob
# there is junk that must not count).
OLD = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.7, 0.0]])
REF = torch.tensor([[-1.5, -1.0, -0.5], [-0.2, -0.9, -3.0]])
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])
# -(old - ref) * mask, token by token
REWARDS = torch.tensor([[-0.5, 1.0, 0.0], [0.1, -0.2, 0.0]])


def test_the_reward_is_minus_the_student_teacher_log_ratio_on_response_tokens():
    rewards, metrics = distillation_rewards(OLD, REF, MASK)
    torch.testing.assert_close(rewards, REWARDS)
    # token means of old - ref: (0.5 - 1.0 + 0) / 3 and (-0.1 + 0.2) / 2; their mean
    assert metrics["distillation/reverse_kl"] == pytest.approx((-1 / 6 + 0.05) / 2)


def test_no_op_passes_the_token_rewards_through_as_advantages_and_returns():
    scores = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.5, 7.0]])
    advantages, returns = get_adv_estimator_fn("no_op")(token_level_rewards=scores, response_mask=MASK)
    expected = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.5, 0.0]])  # masked positions 0, as every estimator's
    torch.testing.assert_close(advantages, expected)
    torch.testing.assert_close(returns, expected)


@pytest.mark.parametrize("kl_in_reward", [False, True])
def test_the_trainer_trains_on_the_teachers_grades_not_on_the_scores(kl_in_reward):
    # use_kl_in_reward=true (SkyRL's scripts set it) adds no coefficient-weighted KL on top.
    config = build_config([*DISTILL, f"algorithm.use_kl_in_reward={str(kl_in_reward).lower()}"])
    batch = DataProto.from_dict(
        tensors={
            "token_level_scores": torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]]),
            "old_log_probs": OLD,
            "ref_log_prob": REF,
            "response_mask": MASK,
        },
        non_tensors={"uid": ["a", "a"]},
    )
    metrics = {}
    trainer = SimpleNamespace(config=config, kl_ctrl=None, state=SimpleNamespace(global_step=1))
    out = PPOTrainer._advantages(trainer, batch, metrics)
    torch.testing.assert_close(out.batch["token_level_rewards"], REWARDS)
    torch.testing.assert_close(out.batch["advantages"], REWARDS)
    torch.testing.assert_close(out.batch["returns"], REWARDS)
    assert metrics["distillation/reverse_kl"] == pytest.approx((-1 / 6 + 0.05) / 2)
    assert "actor/reward_kl_penalty" not in metrics


def test_the_console_line_shows_the_kl_to_the_teacher():
    from hybrid.tracking import console_line

    line = console_line({"distillation/reverse_kl": 0.062, "actor/ppo_kl": 0.0, "critic/score/mean": 0.0}, 1)
    assert line.startswith("step 1 | score 0 | kl 0.062")


def test_distillation_loads_the_teacher_and_keeps_the_old_log_prob_pass():
    config = build_config(DISTILL)
    assert config.use_reference_policy and config.actor_rollout_ref.ref.model.path == "/models/teacher"
    # A one-step update would otherwise skip the pass whose log-probs the reward reads.
    assert config.actor_rollout_ref.actor.on_policy_update is False
    assert build_config([]).actor_rollout_ref.actor.on_policy_update is True
    # verl's spelling (its yaml has no ref.model): +key is read as the same key
    verl = build_config(["+actor_rollout_ref.ref.model.path=/t", "algorithm.use_kl_in_reward=true"])
    assert verl.actor_rollout_ref.ref.model.path == "/t"


def _problems(overrides: list[str]) -> list[str]:
    with pytest.raises(ConfigError) as info:
        build_config(overrides)
    return [line.strip() for line in str(info.value).splitlines()]


def test_combinations_that_make_no_sense_are_refused_in_one_line():
    assert (
        "- algorithm.on_policy_distillation=True grades the student's tokens by a teacher loaded as the reference "
        f"model, but {TEACHER}=None is the student itself: set it to the teacher's folder (a model other than "
        "actor_rollout_ref.model.path, with the same tokenizer)"
    ) in _problems(["algorithm.on_policy_distillation=true"])
    assert (
        "- algorithm.on_policy_distillation=True puts the KL to the teacher in the reward; "
        "actor_rollout_ref.actor.use_kl_loss=True would add it again to the loss: set use_kl_loss=false"
    ) in _problems([*DISTILL, "actor_rollout_ref.actor.use_kl_loss=true"])
    assert (
        f"- {TEACHER}='/models/teacher' names a reference model, but nothing reads one: set "
        "algorithm.on_policy_distillation=true (a teacher), algorithm.use_kl_in_reward or "
        "actor_rollout_ref.actor.use_kl_loss (a KL anchor), or drop the key"
    ) in _problems([f"{TEACHER}=/models/teacher"])


def _model_folder(folder: Path, tokenizer=None, vocab_size: int = 0) -> str:
    """A model folder's config.json and, when given, tokenizer (no weights: the vocabulary check
    reads neither)."""
    from transformers import LlamaConfig

    folder.mkdir()
    LlamaConfig(vocab_size=vocab_size or len(tokenizer), hidden_size=64, num_attention_heads=2).save_pretrained(folder)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    return str(folder)


def test_a_teacher_with_another_vocabulary_is_refused_in_one_line(tmp_path, tokenizer):
    from hybrid.preflight import Findings, check_model_settings

    n = len(tokenizer)
    student = _model_folder(tmp_path / "student", tokenizer)
    assert teacher_vocabulary_problem(student, student, student, student) is None
    # a larger (padded) output layer is fine; a smaller one cannot grade every id the student samples
    assert (
        teacher_vocabulary_problem(student, student, _model_folder(tmp_path / "padded", vocab_size=n + 64), None)
        is None
    )
    small = _model_folder(tmp_path / "small", vocab_size=n - 1)
    assert teacher_vocabulary_problem(student, student, small, None) == (
        f"{TEACHER}={small!r}: the teacher's output layer has {n - 1} rows (config vocab_size), fewer than the "
        f"student's {n}: its vocabulary differs from the student's; use a teacher with the student's tokenizer"
    )
    other_tokenizer = tokenizer.__class__.from_pretrained(student)
    other_tokenizer.add_tokens(["<teacher_only>"])
    other = _model_folder(tmp_path / "other", other_tokenizer)
    found = Findings()  # as the checks before a run find it (hybrid/preflight.py)
    check_model_settings(
        build_config([f"actor_rollout_ref.model.path={student}", *DISTILL[:2], f"{TEACHER}={other}"]), found
    )
    assert found.problems == [
        f"{TEACHER}={other!r}: the teacher's tokenizer differs from the student's ({student!r}): {n + 1} vs {n} "
        f"tokens, first difference '<teacher_only>' (id {n}); the teacher grades the student's token ids, so it "
        "must use the student's tokenizer"
    ]


def _skyrl_examples() -> list[dict]:
    examples = json.loads((REPO / "tests/data/peer_examples/skyrl.json").read_text())["examples"]
    return [e for e in examples if e["path"].startswith("examples/train/on_policy_distillation/")]


def test_skyrls_distillation_examples_are_understood_as_hybrids_distillation(tmp_path):
    from hybrid.dialects import translate_argv
    from scripts.peer_examples import UNDERSTOOD
    from scripts.peer_examples.skyrl import check

    examples = _skyrl_examples()
    assert sorted(Path(e["path"]).name for e in examples) == [
        "run_on_policy_distill_math_qwen3_1.7b.sh",
        "run_on_policy_distill_math_qwen3_4b.sh",
    ]
    for example in examples:
        assert check(example, tmp_path) == (UNDERSTOOD, "")
        # what the entry module adds, in hybrid's key on the SkyRL line
        config = build_config(translate_argv(["--dialect", "skyrl", *example["argv"], DISTILL[0]]))
        algorithm, arr = config.algorithm, config.actor_rollout_ref
        assert (algorithm.on_policy_distillation, algorithm.adv_estimator) == (True, "no_op")
        assert arr.ref.model.path == "/home/user/ckpts/dapo_qwen3_4b_base/global_step_90/"
        assert arr.model.path.startswith("Qwen/Qwen3-") and arr.actor.use_kl_loss is False
        # importance_sampling: -ratio x A, PPO's clip at bounds no ratio reaches
        assert arr.actor.policy_loss.loss_mode == "vanilla" and arr.actor.clip_ratio_high == 1e9


def test_a_skyrl_reference_model_nothing_reads_is_refused():
    from hybrid.dialects import translate_argv

    argv = ["--dialect", "skyrl", "trainer.policy.model.path=/m/student", "trainer.ref.model.path=/m/teacher"]
    # SkyRL's own default use_kl_loss=true reads the reference: with it, the path is used
    assert build_config(translate_argv(argv)).actor_rollout_ref.ref.model.path == "/m/teacher"
    no_kl = [*argv, "trainer.algorithm.use_kl_loss=false"]
    assert f"- {TEACHER}='/m/teacher' names a reference model, but nothing reads one" in str(
        pytest.raises(ConfigError, build_config, translate_argv(no_kl)).value
    )
    # the policy's own path is SkyRL's default: nothing to load
    same = build_config(translate_argv([*argv[:3], "trainer.ref.model.path=/m/student"]))
    assert same.actor_rollout_ref.ref.model.path is None
