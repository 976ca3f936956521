"""Tensor-parallel rollout in the fused worker (workers/rollout/tensor_parallel.py), on two CPU
ranks through Ray as hybrid builds its groups (hybrid/roles.build_worker_groups): with
`tensor_model_parallel_size=2` the two ranks' in-process vLLM engines are the two shards of one
engine (`external_launcher`, gloo), each loaded with the full tensors gathered from FSDP. A
tiny Llama with 4 heads and 2 key/value heads (head size 32), fp32, greedy: the samples of the
TP=2 group equal those of two TP=1 engines (tokens exactly, the engine's log-probs within 1e-4),
for prompts of different lengths that the worker group splits over the ranks; and (slow tier) so
do the samples of one greedy GRPO step with the lock-step multi-turn loop (arithmetic_retry:
model turns with the environment's observations between them), run on every rank of the group.
"""

from __future__ import annotations

import pytest
import torch

from tests.integration.checkpoint_helpers import run_config

pytestmark = pytest.mark.integration

TP_KEY = "actor_rollout_ref.rollout.tensor_model_parallel_size"
PROMPTS = ["What is 3 + 4?", "Name a color.", "Count to five, please, slowly and clearly", "Hi"]
LOG_PROB_TOL = 1e-4


@pytest.fixture(scope="module")
def arithmetic_files(tmp_path_factory):
    from hybrid.arithmetic_task import write_arithmetic_parquet

    return write_arithmetic_parquet(tmp_path_factory.mktemp("arith_tp"), n_train=8, n_val=4, seed=5)


@pytest.fixture(scope="module")
def ray_session():
    import ray

    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    yield
    ray.shutdown()


def prompt_batch(tokenizer, width: int = 16):
    """The prompts left-padded to `width`, as the data loader gives them."""
    from protocol.data_proto import DataProto

    rows = [tokenizer(p)["input_ids"][:width] for p in PROMPTS]
    ids = torch.full((len(rows), width), tokenizer.pad_token_id)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, width - len(row) :] = torch.tensor(row)
        mask[i, width - len(row) :] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return DataProto.from_dict(
        tensors={"input_ids": ids, "attention_mask": mask, "position_ids": positions}, meta_info={"do_sample": False}
    )


def generate(model_dir, files, out_dir, tokenizer, tp: int) -> dict:
    from hybrid.roles import build_worker_groups
    from hybrid.trainer import as_typed

    cfg = as_typed(
        run_config(
            model_dir,
            files,
            out_dir,
            "trainer.n_gpus_per_node=2",
            "trainer.worker_group=ray",
            "actor_rollout_ref.rollout.name=vllm",
            f"{TP_KEY}={tp}",
            "actor_rollout_ref.rollout.max_num_batched_tokens=256",
        )
    )
    groups = build_worker_groups(cfg)
    try:
        wg = groups["actor_rollout"]
        wg.init_model()
        wg.update_rollout_weights()
        out = wg.generate_sequences(prompt_batch(tokenizer))
    finally:
        groups["actor_rollout"].shutdown()
        groups["pool"].remove()
    return {"responses": out.batch["responses"], "log_probs": out.batch["rollout_log_probs"], "rows": len(out)}


def test_tp2_rollout_equals_tp1(ray_session, tp_model_dir, arithmetic_files, tmp_path, tokenizer):
    one = generate(tp_model_dir, arithmetic_files, tmp_path / "tp1", tokenizer, tp=1)
    two = generate(tp_model_dir, arithmetic_files, tmp_path / "tp2", tokenizer, tp=2)
    assert one["rows"] == two["rows"] == len(PROMPTS)  # do_sample=False: one greedy sample each
    # Every row has its own tokens: the rows of the two ranks' prompts are not one another's.
    assert len({tuple(r.tolist()) for r in one["responses"]}) == len(PROMPTS)
    assert torch.equal(one["responses"], two["responses"])
    gap = (one["log_probs"] - two["log_probs"]).abs().max().item()
    assert gap <= LOG_PROB_TOL, gap


MT = "actor_rollout_ref.rollout.multi_turn"


def multi_turn_step(model_dir, files, out_dir, tp: int, monkeypatch):
    """One greedy GRPO step with the lock-step multi-turn loop (arithmetic_retry: up to 3 model
    turns with the environment's observations between them); the generated batch."""
    from hybrid.rollouts import Rollouts
    from tests.integration.checkpoint_helpers import train

    generated = []
    generate = Rollouts.generate

    def recording(self, gen_batch):
        out = generate(self, gen_batch)
        generated.append(out)
        return out

    monkeypatch.setattr(Rollouts, "generate", recording)
    cfg = run_config(
        model_dir,
        files,
        out_dir,
        "trainer.n_gpus_per_node=2",
        "trainer.worker_group=ray",
        "trainer.total_training_steps=1",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.do_sample=false",
        f"{TP_KEY}={tp}",
        "actor_rollout_ref.rollout.max_num_batched_tokens=256",
        "data.max_response_length=64",
        f"{MT}.enable=true",
        f"{MT}.env_class=arithmetic_retry",
        f"{MT}.max_assistant_turns=3",
        f"{MT}.max_tokens_per_turn=6",
    )
    train(cfg)
    (batch,) = generated
    return batch


@pytest.mark.slow
def test_tp2_multi_turn_equals_tp1(ray_session, tp_model_dir, arithmetic_files, tmp_path, monkeypatch):
    one = multi_turn_step(tp_model_dir, arithmetic_files, tmp_path / "tp1", 1, monkeypatch)
    two = multi_turn_step(tp_model_dir, arithmetic_files, tmp_path / "tp2", 2, monkeypatch)
    turns = [int(t) for t in one.non_tensor_batch["multi_turn_turns"]]
    assert max(turns) > 1, turns  # the environment answered and the model took further turns
    assert turns == [int(t) for t in two.non_tensor_batch["multi_turn_turns"]]
    for key in ("responses", "response_mask"):
        assert torch.equal(one.batch[key], two.batch[key]), key
    mask = one.batch["response_mask"].bool()
    gap = (one.batch["rollout_log_probs"] - two.batch["rollout_log_probs"])[mask].abs().max().item()
    assert gap <= LOG_PROB_TOL, gap
