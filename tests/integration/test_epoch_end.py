"""A run ends with its epochs, as verl's fit (`for epoch in range(current_epoch, total_epochs)`):
trainer.total_training_steps beyond total_epochs x batches per epoch does not loop the data, the
epoch's end is the last step (checkpointed as such) and the console says so; a run resumed
mid-way counts the epochs from its checkpoint's data position. On the tiny model."""

from __future__ import annotations

import pytest

from tests.integration.checkpoint_helpers import run_config, train

pytestmark = pytest.mark.integration

EXPECTED_LINE = (
    "hybrid: the run ends with its epochs at step 2, before trainer.total_training_steps=5: "
    "trainer.total_epochs=1 x 2 steps per epoch (as verl; the learning-rate schedules still span 5 steps); "
    "raise trainer.total_epochs to train longer"
)


@pytest.fixture(scope="module")
def arithmetic_files(tmp_path_factory):
    from hybrid.arithmetic_task import write_arithmetic_parquet

    # 8 prompts / 4 a step: 2 steps per epoch
    return write_arithmetic_parquet(tmp_path_factory.mktemp("arith"), n_train=8, n_val=4, seed=5)


def _schedule_steps(trainer) -> dict:
    return {"schedule": trainer.config.actor_rollout_ref.actor.optim.total_training_steps}


def test_more_steps_than_the_epochs_hold_stop_at_the_epoch_end(tiny_model_dir, arithmetic_files, tmp_path, capsys):
    # save_freq 5: the only checkpoint a 2-step run writes is its last step's.
    common = ["trainer.total_training_steps=5", "trainer.save_freq=5", "actor_rollout_ref.actor.ppo_mini_batch_size=4"]
    first = train(
        run_config(tiny_model_dir, arithmetic_files, tmp_path, *common, "trainer.total_epochs=1"),
        inspect=_schedule_steps,
    )
    assert [h["step"] for h in first["history"]] == [1, 2] and first["result"]["steps"] == 2
    assert first["schedule"] == 5  # verl: the optimizers' schedules span total_training_steps
    assert EXPECTED_LINE in capsys.readouterr().out.splitlines()
    assert (tmp_path / "global_step_2").is_dir()  # the epoch's end is the last step
    # Resumed at step 2 (the first epoch done) with two epochs: the second epoch's 2 steps.
    second = train(run_config(tiny_model_dir, arithmetic_files, tmp_path, *common, "trainer.total_epochs=2"))
    assert [h["step"] for h in second["history"]] == [3, 4] and second["result"]["steps"] == 4
    assert (tmp_path / "global_step_4").is_dir()


# Every other prompt's two samples score alike (a flat group, which dynamic sampling drops).
HALF_FLAT_REWARD = """
import zlib


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if extra_info["index"] % 2:
        return 0.0
    return zlib.crc32(solution_str.encode()) / 2**32
"""


def test_dynamic_sampling_that_uses_the_epoch_up_early_ends_the_run_there(
    tiny_model_dir, arithmetic_files, tmp_path, capsys
):
    # Half the 8 prompts vary: the epoch's two batches fill one step of 4 groups, not two.
    reward_file = tmp_path / "half_flat.py"
    reward_file.write_text(HALF_FLAT_REWARD)
    out = train(
        run_config(
            tiny_model_dir,
            arithmetic_files,
            tmp_path,
            "trainer.total_training_steps=null",  # total_epochs=1 x 2 batches: 2 steps planned
            "trainer.save_freq=5",
            "algorithm.adv_estimator=grpo",
            "algorithm.filter_groups.enable=true",
            "algorithm.filter_groups.metric=seq_reward",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            f"custom_reward_function.path={reward_file}",
            "custom_reward_function.name=compute_score",
        )
    )
    assert [h["step"] for h in out["history"]] == [1] and out["result"]["steps"] == 1
    assert out["history"][0]["train/num_gen_batches"] == 2
    assert (
        "hybrid: the training data ran out after trainer.total_epochs=1 at step 1 of the 2 planned "
        "(algorithm.filter_groups drew more than one batch for some steps); the run ends here"
    ) in capsys.readouterr().out.splitlines()
    assert (tmp_path / "global_step_1").is_dir()  # saved as the last step
