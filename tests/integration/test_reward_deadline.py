"""A deadline on the reward function call in the default (naive) manager: a user reward function
that never returns on one sample no longer stalls the run. A two-step run of the tiny model (hf
engine, one in-process rank) whose reward file sleeps forever on its third call finishes; that
sample scores 0 (the others 1, so step 1's mean score is 7/8), `reward/timeouts` counts it at
step 1 and not at step 2, and one console line names the sample and how long it ran. The same
deadline holds where the manager is called from a thread (the reward loop's workers), where
SIGALRM cannot reach: the call is abandoned and the sample counted."""

from __future__ import annotations

import textwrap
import threading

import pytest

from tests.integration.checkpoint_helpers import run_config, train

pytestmark = pytest.mark.integration

REWARD_FILE = """
import time

CALLS = [0]


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    CALLS[0] += 1
    if CALLS[0] == 3:
        while True:  # never returns
            time.sleep(3600)
    return 1.0
"""


@pytest.fixture(scope="module")
def arithmetic_files(tmp_path_factory):
    from hybrid.arithmetic_task import write_arithmetic_parquet

    return write_arithmetic_parquet(tmp_path_factory.mktemp("arith"), n_train=16, n_val=4, seed=3)


def test_a_reward_function_that_never_returns_scores_failed_and_is_counted(
    tiny_model_dir, arithmetic_files, tmp_path, capsys
):
    reward_file = tmp_path / "stuck_reward.py"
    reward_file.write_text(textwrap.dedent(REWARD_FILE))
    cfg = run_config(
        tiny_model_dir,
        arithmetic_files,
        tmp_path / "ckpt",
        "trainer.total_training_steps=2",
        "trainer.save_freq=-1",
        f"custom_reward_function.path={reward_file}",
        "custom_reward_function.name=compute_score",
        "reward_model.reward_kwargs.timeout_s=1.5",
    )
    out = train(cfg)
    history = out["history"]
    assert [h["step"] for h in history] == [1, 2]
    assert history[0]["reward/timeouts"] == 1.0 and history[1]["reward/timeouts"] == 0.0
    # 4 prompts x 2 samples: seven score 1, the stuck one 0.
    assert history[0]["critic/score/mean"] == pytest.approx(7 / 8)
    assert history[0]["critic/score/min"] == 0.0
    assert history[1]["critic/score/mean"] == pytest.approx(1.0)
    console = capsys.readouterr().out
    lines = [line for line in console.splitlines() if "ran past" in line]
    assert len(lines) == 1, console[-3000:]
    line = lines[0]
    assert "reward_model.reward_kwargs.timeout_s=1.5 s" in line and "score 0" in line
    assert "sample 2 (data_source=" in line and "extra_info.index=" in line and "after 1.5 s" in line
    assert "Traceback" not in console


def test_the_deadline_holds_when_the_manager_is_called_from_a_thread(tokenizer):
    from reward.manager import NaiveRewardManager
    from tests.unit.test_reward_manager import make_batch

    release = threading.Event()

    def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
        if extra_info["index"] == 1:
            release.wait()  # blocks until the test ends: no signal can reach this thread
        return 1.0

    manager = NaiveRewardManager(tokenizer, 0, compute_score, timeout_s=0.5)
    data, lengths = make_batch(tokenizer, ["1", "2", "3"], ["1", "2", "3"])
    box = {}
    caller = threading.Thread(target=lambda: box.update(manager(data, return_dict=True)))
    caller.start()
    caller.join(30)
    release.set()
    assert not caller.is_alive()
    scores = box["reward_tensor"].sum(-1).tolist()
    assert scores == [1.0, 0.0, 1.0]
    assert box["reward_metrics"]["reward/timeouts"] == 1.0
    # Scored again without a stuck sample, the count starts from 0.
    assert manager(data, return_dict=True)["reward_metrics"]["reward/timeouts"] == 0.0
    for thread in threading.enumerate():  # the abandoned call, released above, ends
        if thread.name == "reward-call":
            thread.join(10)
