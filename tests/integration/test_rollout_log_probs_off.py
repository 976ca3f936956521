"""One GRPO step on the tiny model with `actor_rollout_ref.rollout.calculate_log_probs=false`
(verl's default; SkyRL's logprobs=null): the step trains, the generated batch carries no
`rollout_log_probs` (the hf engine returns them; Rollouts.complete drops them), and the
engine/trainer gap, read from them, is not logged."""

from __future__ import annotations

import math

import pytest

from tests.integration.checkpoint_helpers import run_config, train

pytestmark = pytest.mark.integration


def test_a_step_without_the_engines_log_probs(tiny_model_dir, tmp_path, monkeypatch):
    from hybrid.arithmetic_task import write_arithmetic_parquet
    from hybrid.rollouts import Rollouts

    files = write_arithmetic_parquet(tmp_path / "data", n_train=4, n_val=4, seed=5)
    generated = []
    complete = Rollouts.complete

    def spy(self, batch, gen_out, timing, into=None):
        generated.append(set(gen_out.batch.keys()))  # as the engine returned it
        out = complete(self, batch, gen_out, timing, into)
        generated.append(set(out[0].batch.keys()))  # the rows the step trains on
        return out

    monkeypatch.setattr(Rollouts, "complete", spy)
    cfg = run_config(
        tiny_model_dir,
        files,
        tmp_path / "run",
        "trainer.total_training_steps=1",
        "actor_rollout_ref.rollout.calculate_log_probs=false",
    )
    (step,) = train(cfg)["history"]
    (engine, trained) = generated
    assert "rollout_log_probs" in engine  # the hf engine computes them from its scores anyway
    assert "responses" in trained and "rollout_log_probs" not in trained
    # Two mini batches of 2 prompts: the old log-prob pass ran, and the gap to the engine's is absent.
    assert "timing_s/old_log_prob" in step and "rollout/logp_abs_diff_mean" not in step
    assert math.isfinite(step["actor/pg_loss"]) and math.isfinite(step["actor/grad_norm"])
