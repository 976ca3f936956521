"""trainer.num_dummy_steps on the tiny model (hybrid/dummy_steps.py, SkyRL's full-context
trainer): the dummy steps go through the real workers with rows of exactly max_prompt_length +
max_response_length tokens, log their metrics, and then the run ends, as SkyRL's does: no
generation, no validation, no checkpoint, no real step."""

from __future__ import annotations

import json

import pytest

from tests.integration.checkpoint_helpers import probe_batch, run_config, train

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def arithmetic_files(tmp_path_factory):
    from hybrid.arithmetic_task import write_arithmetic_parquet

    return write_arithmetic_parquet(tmp_path_factory.mktemp("arith"), n_train=8, n_val=4, seed=5)


def test_dummy_steps_train_at_the_max_lengths_then_the_run_ends(
    tiny_model_dir, arithmetic_files, tmp_path, capsys, tokenizer
):
    import torch
    from transformers import AutoModelForCausalLM

    probe = probe_batch(tokenizer)
    with torch.no_grad():
        before = AutoModelForCausalLM.from_pretrained(tiny_model_dir)(input_ids=probe, use_cache=False).logits
    out = train(
        run_config(
            tiny_model_dir,
            arithmetic_files,
            tmp_path,
            "trainer.num_dummy_steps=2",
            "trainer.val_before_train=true",  # not read by a dummy run (SkyRL's eval_before_train neither)
            "trainer.save_freq=1",  # nor checkpoints
            "actor_rollout_ref.actor.use_kl_loss=true",  # the reference's forward runs too
        ),
        probe_ids=probe,
    )
    history = out["history"]
    assert [h["step"] for h in history] == [1, 2] and out["result"]["steps"] == 2
    assert out["result"]["val_before"] == {} and out["result"]["val_after"] == {}
    rows, tokens = 4 * 2, 64 + 8  # train_batch_size x n, max_prompt_length + max_response_length
    for metrics in history:
        assert metrics["prompt_length/min"] == 64 and metrics["response_length/min"] == 8
        assert metrics["perf/total_num_tokens"] == rows * tokens
        # the real step after the rollout: old and reference log-probs, advantages, the update, the push
        assert {"old_log_prob", "ref", "adv", "update_actor", "update_weights"} <= {
            k.removeprefix("timing_s/") for k in metrics if k.startswith("timing_s/")
        }
        assert "timing_s/gen" not in metrics and "timing_s/testing" not in metrics
        assert "actor/pg_loss" in metrics and "actor/kl_loss" in metrics
        assert metrics["perf/worker_cpu_memory_rss_gb"] > 0
    logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged] == [1, 2]
    assert not list(tmp_path.glob("global_step_*"))
    assert not torch.allclose(out["logits"], before.float(), atol=1e-4)  # the optimizer stepped
    printed = capsys.readouterr().out
    assert (
        "hybrid: trainer.num_dummy_steps=2: 2 steps on random batches of 4 prompts x 2 samples, each 64 prompt + "
        "8 response tokens, then the run ends (no real training)"
    ) in printed
    assert "hybrid: 2 of 2 dummy steps done; the run ends here" in printed
