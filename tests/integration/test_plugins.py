"""A plug-in module named by `actor_rollout_ref.model.external_lib` registers an advantage
estimator; the command line then accepts its name and one training step calls it (the tiny
random model, the Hugging Face rollout engine, one in-process rank)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]

PLUGIN = textwrap.dedent('''
    """Test plug-in: GRPO's advantages, and a note that this estimator ran."""
    import os

    from hybrid.core_algos import get_adv_estimator_fn, register_adv_est


    @register_adv_est("grpo_with_note")
    def grpo_with_note(**kwargs):
        advantages, returns = get_adv_estimator_fn("grpo")(**kwargs)
        with open(os.environ["PLUGIN_NOTE"], "a") as note:
            note.write(f"{advantages.shape[0]}\\n")
        return advantages, returns
''')


def test_plugin_estimator_runs_from_the_command_line(tmp_path, tiny_model_dir):
    from hybrid.arithmetic_task import write_arithmetic_parquet

    files = write_arithmetic_parquet(tmp_path / "data", n_train=16, n_val=4, seed=3)
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / "my_plugin.py").write_text(PLUGIN)
    note = tmp_path / "note.txt"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path / "plugins"), str(REPO)]),
        "PLUGIN_NOTE": str(note),
        "OMP_NUM_THREADS": "1",
    }
    overrides = [
        "actor_rollout_ref.model.external_lib=my_plugin",
        "algorithm.adv_estimator=grpo_with_note",
        f"actor_rollout_ref.model.path={tiny_model_dir}",
        f"data.train_files={files['train']}",
        f"data.val_files={files['val']}",
        "data.train_batch_size=4",
        "data.max_response_length=8",
        "actor_rollout_ref.rollout.name=hf",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "trainer.total_training_steps=1",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.logger=[file]",
        "trainer.merge_on_finish=false",
        "trainer.plot_on_finish=false",
        f"trainer.default_local_dir={tmp_path / 'run'}",
    ]
    result = subprocess.run(
        [sys.executable, "-m", "hybrid.main_ppo", *overrides],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert note.read_text().split() == ["8"]  # one step of 4 prompts x 2 samples
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert json.loads(lines[-1])["step"] == 1
