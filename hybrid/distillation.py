"""On-policy distillation (`algorithm.on_policy_distillation=true`): the student (the actor)
samples, a teacher grades each sampled token, and the student is trained on those grades
instead of the environment's reward (Thinking Machines' on-policy distillation, SkyRL's
examples/train/on_policy_distillation).

The teacher is loaded as the reference model, from `actor_rollout_ref.ref.model.path` (a
different, usually larger model with the student's tokenizer). After the old log-prob pass
(the student's log-probs, recomputed by the trainer, or the engine's own in bypass mode) and
the reference pass (the teacher's), each response token's reward is the negative reverse-KL
sample of SkyRL's example (its OnPolicyDistillationTrainer.apply_reward_kl_penalty):

    token_level_rewards = -(old_log_probs - ref_log_prob) * response_mask

with no KL coefficient and the scores dropped (they are still computed and logged as
`critic/score/*`); SkyRL's `no_op` estimator (hybrid/core_algos.py) then passes these rewards
through as advantages and returns. That is the order of SkyRL's trainer: log-probs, the
reward step it replaces, advantages, the update. `use_kl_in_reward=true` beside it (what
SkyRL's scripts set, to reach the step its trainer replaces) changes nothing more.

This module holds the reward, the config rules (`check_distillation`, run with the other
cross-key rules) and the check, before any model loads, that the teacher reads the
student's token ids (`teacher_vocabulary_problem`, hybrid/preflight.py).
"""

from __future__ import annotations

import os

import torch

from protocol.config_schema import Problems, fmt, valid

ARR = "actor_rollout_ref"
TEACHER_KEY = f"{ARR}.ref.model.path"


def distillation_rewards(
    old_log_probs: torch.Tensor, ref_log_prob: torch.Tensor, response_mask: torch.Tensor
) -> tuple[torch.Tensor, dict[str, float]]:
    """Token rewards `-(old_log_probs - ref_log_prob) * response_mask`, (B, T), and the batch's
    reverse KL (`distillation/reverse_kl`: the mean over responses of each one's token mean of
    `old - ref`, the k1 estimate of KL(student || teacher)), which the rewards are minus."""
    mask = response_mask.to(old_log_probs.dtype)
    log_ratio = (old_log_probs - ref_log_prob) * mask
    per_response = log_ratio.sum(-1) / mask.sum(-1).clamp(min=1)
    return -log_ratio, {"distillation/reverse_kl": float(per_response.mean()) if len(per_response) else 0.0}


def check_distillation(config, problems: Problems) -> None:
    """A teacher for on-policy distillation, and a reference model of its own only where
    something reads the reference."""
    algorithm, arr = config.algorithm, config.actor_rollout_ref
    teacher = arr.ref.model.path
    if not valid(teacher, arr.model.path):
        return
    if algorithm.on_policy_distillation is True:
        if not teacher or teacher == arr.model.path:
            problems.add(
                f"algorithm.on_policy_distillation=True grades the student's tokens by a teacher loaded as the "
                f"reference model, but {TEACHER_KEY}={fmt(teacher)} is the student itself: set it to the teacher's "
                f"folder (a model other than {ARR}.model.path, with the same tokenizer)"
            )
        if arr.actor.use_kl_loss is True:
            problems.add(
                f"algorithm.on_policy_distillation=True puts the KL to the teacher in the reward; "
                f"{ARR}.actor.use_kl_loss=True would add it again to the loss: set use_kl_loss=false"
            )
    elif teacher and teacher != arr.model.path and not config.use_reference_policy:
        problems.add(
            f"{TEACHER_KEY}={fmt(teacher)} names a reference model, but nothing reads one: set "
            f"algorithm.on_policy_distillation=true (a teacher), algorithm.use_kl_in_reward or {ARR}.actor.use_kl_loss "
            f"(a KL anchor), or drop the key"
        )


# The files a tokenizer's vocabulary is read from (byte-equal in two folders: the same vocabulary).
VOCABULARY_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.json",
    "merges.txt",
    "vocab.txt",
    "tokenizer.model",
    "added_tokens.json",
)


def _same_tokenizer_files(first: str, second: str) -> bool:
    """Two local tokenizer folders whose vocabulary files are the same bytes (loading two large
    tokenizers to compare them takes seconds; a teacher of the student's family usually ships
    the very same files)."""
    if not (os.path.isdir(first) and os.path.isdir(second)):
        return False
    names = [n for n in VOCABULARY_FILES if os.path.isfile(os.path.join(first, n))]
    if not names or names != [n for n in VOCABULARY_FILES if os.path.isfile(os.path.join(second, n))]:
        return False
    for name in names:
        with open(os.path.join(first, name), "rb") as a, open(os.path.join(second, name), "rb") as b:
            if a.read() != b.read():
                return False
    return True


def teacher_vocabulary_problem(
    student: str, student_tokenizer: str, teacher: str, teacher_tokenizer: str | None, trust_remote_code: bool = False
) -> str | None:
    """Why the teacher at `teacher` cannot grade the student's tokens, or None. The reference
    log-probs are read at the token ids the student sampled, so the teacher's output layer must
    have a row for every id the student's can sample (config vocab_size; a larger, padded one, as
    Qwen2.5's bigger models have, is fine), and the two tokenizers must map the same tokens to
    the same ids (`teacher_tokenizer`: the teacher's tokenizer folder, None when it has none)."""
    from transformers import AutoConfig, AutoTokenizer

    def output_rows(path: str) -> int | None:
        model_config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code, local_files_only=True)
        return getattr(model_config.get_text_config(), "vocab_size", None)

    student_rows, teacher_rows = output_rows(student), output_rows(teacher)
    if student_rows is not None and teacher_rows is not None and teacher_rows < student_rows:
        return (
            f"{TEACHER_KEY}={teacher!r}: the teacher's output layer has {teacher_rows} rows (config vocab_size), "
            f"fewer than the student's {student_rows}: its vocabulary differs from the student's; use a teacher "
            f"with the student's tokenizer"
        )
    if teacher_tokenizer is None or _same_tokenizer_files(student_tokenizer, teacher_tokenizer):
        return None
    load = {"trust_remote_code": trust_remote_code, "local_files_only": True}
    mine = AutoTokenizer.from_pretrained(student_tokenizer, **load).get_vocab()
    other = AutoTokenizer.from_pretrained(teacher_tokenizer, **load).get_vocab()
    if mine == other:
        return None
    token, token_id = sorted(set(mine.items()) ^ set(other.items()), key=lambda item: (item[1], item[0]))[0]
    return (
        f"{TEACHER_KEY}={teacher!r}: the teacher's tokenizer differs from the student's ({student_tokenizer!r}): "
        f"{len(other)} vs {len(mine)} tokens, first difference {token!r} (id {token_id}); the teacher grades the "
        f"student's token ids, so it must use the student's tokenizer"
    )


__all__ = ["check_distillation", "distillation_rewards", "teacher_vocabulary_problem"]
