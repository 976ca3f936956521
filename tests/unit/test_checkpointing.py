"""The driver's checkpoint folder logic without any model: which folder resume takes (the
tracker's, else the highest complete one; never a `.partial` one), the messages for
unusable resume paths, retention, and the config checks of checkpoint and LoRA keys."""

from __future__ import annotations

import pytest

from hybrid.checkpoint_folders import (
    apply_retention,
    checkpoint_problem,
    latest_checkpoint,
    remove_partial_checkpoints,
    resume_path_problem,
)
from hybrid.config import ConfigError, build_config, load_config, validate_config

ARR = "actor_rollout_ref"


def make_checkpoint(root, step: int, critic: bool = False, suffix: str = ""):
    path = root / f"global_step_{step}{suffix}"
    for role in ("actor",) + (("critic",) if critic else ()):
        (path / role).mkdir(parents=True)
        (path / role / "fsdp_config.json").write_text("{}")
    (path / "data.pt").write_bytes(b"")
    return path


def test_latest_prefers_tracker_then_highest_complete(tmp_path):
    assert latest_checkpoint(str(tmp_path)) is None
    make_checkpoint(tmp_path, 2)
    make_checkpoint(tmp_path, 4)
    make_checkpoint(tmp_path, 6, suffix=".partial")
    assert latest_checkpoint(str(tmp_path)) == str(tmp_path / "global_step_4")
    # A run resumed from step 2 and saved again: the tracker names its newest save even
    # though an abandoned run left step 4 behind.
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("2")
    assert latest_checkpoint(str(tmp_path)) == str(tmp_path / "global_step_2")
    # A tracker naming a folder that is gone falls back to the scan.
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("8")
    assert latest_checkpoint(str(tmp_path)) == str(tmp_path / "global_step_4")


def test_critic_runs_need_critic_shards(tmp_path):
    make_checkpoint(tmp_path, 2, critic=True)
    make_checkpoint(tmp_path, 4)
    assert latest_checkpoint(str(tmp_path), need_critic=True) == str(tmp_path / "global_step_2")
    assert "has no critic checkpoint" in checkpoint_problem(str(tmp_path / "global_step_4"), need_critic=True)


def test_resume_path_messages(tmp_path):
    make_checkpoint(tmp_path, 2)
    partial = make_checkpoint(tmp_path, 4, suffix=".partial")
    assert resume_path_problem(str(tmp_path / "global_step_2")) is None
    message = resume_path_problem(str(partial))
    assert str(partial) in message and "partial checkpoint" in message
    assert f"complete checkpoints there: {tmp_path / 'global_step_2'}" in message
    message = resume_path_problem(str(tmp_path / "global_step_2" / "actor"))
    assert "did you mean its parent" in message
    assert "does not exist" in resume_path_problem(str(tmp_path / "global_step_9"))


def test_remove_partial_leaves_complete_ones(tmp_path):
    make_checkpoint(tmp_path, 2)
    make_checkpoint(tmp_path, 4, suffix=".partial")
    make_checkpoint(tmp_path, 2, suffix=".old.partial")
    (tmp_path / "metrics.jsonl").write_text("")
    removed = remove_partial_checkpoints(str(tmp_path))
    assert sorted(removed) == [str(tmp_path / "global_step_2.old.partial"), str(tmp_path / "global_step_4.partial")]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step_2", "metrics.jsonl"]


def test_retention_counts_each_role(tmp_path):
    for step in (1, 2, 3):
        make_checkpoint(tmp_path, step, critic=True)
    removed = apply_retention(str(tmp_path), 3, {"actor": 2, "critic": 0})
    assert removed == [str(tmp_path / "global_step_1" / "actor")]
    removed = apply_retention(str(tmp_path), 3, {"actor": 1, "critic": 1})
    assert removed == [
        str(tmp_path / "global_step_2" / "actor"),
        str(tmp_path / "global_step_1" / "critic"),
        str(tmp_path / "global_step_2" / "critic"),
        str(tmp_path / "global_step_1"),
        str(tmp_path / "global_step_2"),
    ]
    assert checkpoint_problem(str(tmp_path / "global_step_3"), need_critic=True) is None


def _problems(overrides):
    with pytest.raises(ConfigError) as info:
        validate_config(load_config(overrides))
    return str(info.value)


def test_config_checks_for_checkpoint_and_lora_keys():
    message = _problems(
        [
            f"{ARR}.actor.checkpoint.save_contents=[model,weights]",
            f"{ARR}.model.lora_rank=8",
            f"{ARR}.model.lora_alpha=0",
            f"{ARR}.model.target_modules=[]",
            "trainer.max_actor_ckpt_to_keep=two",
            "trainer.save_freq=1.5",
        ]
    )
    assert "checkpoint.save_contents=['model', 'weights']: 'weights' not supported" in message
    assert "lora_alpha=0 must be a positive number" in message
    assert "target_modules=[] must be a module name pattern or a list of module names" in message
    assert "trainer.max_actor_ckpt_to_keep='two' must be an integer or null" in message
    assert "trainer.save_freq=1.5 must be an integer" in message
    validate_config(
        load_config(
            [
                f"{ARR}.model.lora_rank=8",
                f"{ARR}.model.target_modules=[q_proj,v_proj]",
                f"{ARR}.model.exclude_modules=[down_proj]",
                "trainer.max_actor_ckpt_to_keep=2",
            ]
        )
    )


class _FakeActorGroup:
    """Writes what a complete actor shard folder needs; records the saves."""

    def __init__(self):
        self.saved = []

    def save_checkpoint(self, path, global_step, max_ckpt_to_keep):
        import os

        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, "fsdp_config.json"), "w") as f:
            f.write("{}")
        self.saved.append(global_step)


@pytest.mark.parametrize(
    "save_freq, merge_on_finish, saved, merged",
    [
        (-1, None, [], False),  # verl: save_freq <= 0 never saves, not even the last step
        (-1, False, [], False),
        (-1, True, [3], True),  # asked for: the last step is saved to be merged
        (2, None, [2, 3], True),  # the last step is saved anyway; null merges it
        (2, False, [2, 3], False),
    ],
)
def test_save_freq_and_merge_on_finish_decide_the_end_of_a_run(
    tmp_path, monkeypatch, save_freq, merge_on_finish, saved, merged
):
    from types import SimpleNamespace

    import hybrid.checkpointing as checkpointing

    merges = []
    monkeypatch.setattr(checkpointing, "merge_final_actor", merges.append)
    overrides = [f"trainer.save_freq={save_freq}", f"trainer.default_local_dir={tmp_path}"]
    if merge_on_finish is not None:  # None: the yaml's default
        overrides.append(f"trainer.merge_on_finish={str(merge_on_finish).lower()}")
    config = build_config(overrides)
    assert config.trainer.merge_on_finish == merge_on_finish
    run = checkpointing.RunCheckpoints(config, use_critic=False)
    group = _FakeActorGroup()
    state = SimpleNamespace(global_step=0, state_dict=lambda: {})  # the TrainerState a save reads
    for step in (1, 2, 3):  # a 3-step run, as PPOTrainer.after_step drives it
        state.global_step = step
        if run.due(step, last_step=step == 3):
            run.save(state, {"actor_rollout": group}, last_step=step == 3)
    assert group.saved == saved
    assert bool(merges) == merged
    assert sorted(p.name for p in tmp_path.glob("global_step_*")) == [f"global_step_{s}" for s in saved]
