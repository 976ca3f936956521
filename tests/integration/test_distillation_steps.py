"""On-policy distillation on the tiny models (hybrid/distillation.py): the student is the tiny
random model, the teacher another tiny random model of a different size (same tokenizer)
loaded as the reference from actor_rollout_ref.ref.model.path. Two steps train; each step's
dumped training batch shows the reward is -(student log-prob - teacher log-prob) on the
response tokens, the teacher's log-probs those of the teacher's own weights (recomputed here
with transformers), and the student moving between the steps."""

from __future__ import annotations

import json
import math

import pytest
import torch

from protocol.data_proto import DataProto
from tests.integration.checkpoint_helpers import response_log_probs, run_config, train

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def arithmetic_files(tmp_path_factory):
    from hybrid.arithmetic_task import write_arithmetic_parquet

    return write_arithmetic_parquet(tmp_path_factory.mktemp("arith"), n_train=8, n_val=4, seed=11)


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory, tokenizer) -> str:
    """3 layers, hidden 128 (the student: 2 layers, hidden 64), the student's tokenizer."""
    from tests.conftest import build_tiny_model_dir

    shape = dict(
        hidden_size=128, intermediate_size=256, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2
    )
    return build_tiny_model_dir(
        tmp_path_factory.mktemp("teacher"), tokenizer, seed=5, tie_word_embeddings=False, **shape
    )


def test_the_student_trains_on_the_teachers_per_token_grades(tiny_model_dir, teacher_dir, arithmetic_files, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cfg = run_config(
        tiny_model_dir,
        arithmetic_files,
        tmp_path,
        "algorithm.on_policy_distillation=true",
        "algorithm.adv_estimator=no_op",
        f"actor_rollout_ref.ref.model.path={teacher_dir}",
        "trainer.total_training_steps=2",
        "trainer.dump_data_batch=true",
        f"trainer.rollout_data_dir={tmp_path / 'rollouts'}",  # verl's JSONL dumps (hybrid/generation_dump.py)
        f"trainer.validation_data_dir={tmp_path / 'val'}",
        "trainer.val_before_train=true",
    )
    history = train(cfg)["history"]
    assert len(history) == 2
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    (val,) = (json.loads(line) for line in (tmp_path / "val" / "0.jsonl").read_text().splitlines()[:1])
    assert len((tmp_path / "val" / "0.jsonl").read_text().splitlines()) == 4 and val["step"] == 0
    assert set(val) >= {"input", "output", "gts", "score", "reward"} and val["score"] == val["reward"]
    student = AutoModelForCausalLM.from_pretrained(tiny_model_dir, torch_dtype=torch.float32)
    teacher = AutoModelForCausalLM.from_pretrained(teacher_dir, torch_dtype=torch.float32)
    for step, metrics in enumerate(history, start=1):
        batch = DataProto.load_from_disk(str(tmp_path / "dumped_data" / f"global_step_{step}_training_input.pt"))
        b = batch.batch
        # the step's rollout file: the trained batch's texts and summed scores, line by line
        rows = [json.loads(line) for line in (tmp_path / "rollouts" / f"{step}.jsonl").read_text().splitlines()]
        assert [r["output"] for r in rows] == tokenizer.batch_decode(b["responses"], skip_special_tokens=True)
        assert [r["score"] for r in rows] == pytest.approx(b["token_level_scores"].sum(-1).tolist())
        assert {r["step"] for r in rows} == {step} and all(r["gts"] is not None for r in rows)
        mask = b["response_mask"].float()
        old, ref = b["old_log_probs"], b["ref_log_prob"]
        torch.testing.assert_close(b["token_level_rewards"], -(old - ref) * mask, rtol=0, atol=0)
        torch.testing.assert_close(b["advantages"], b["token_level_rewards"], rtol=0, atol=0)  # no_op
        # the reference pass ran the teacher's weights, not the student's
        torch.testing.assert_close(ref * mask, response_log_probs(teacher, batch) * mask, rtol=0, atol=1e-4)
        assert float(((old - ref).abs() * mask).max()) > 0.1
        per_response = ((old - ref) * mask).sum(-1) / mask.sum(-1)
        assert metrics["distillation/reverse_kl"] == pytest.approx(float(per_response.mean()), abs=1e-6)
        assert math.isfinite(metrics["actor/pg_loss"]) and math.isfinite(metrics["actor/grad_norm"])
        initial = response_log_probs(student, batch) * mask
        gap = float((old * mask - initial).abs().max())
        if step == 1:  # the old log-probs are the student's own, before any update
            assert gap < 1e-4
        else:  # step 1's update moved the student
            assert gap > 1e-3
