"""The multi-turn example on two ranks through Ray (gloo, CPU): GRPO with the
`arithmetic_retry` environment on the tiny random model, fp32 everywhere, each rank with its
own in-process engine refreshed from the FSDP shards after every update: the HF engine with
no rebalancing and dynamic micro-batches (so the update's shares are uneven too), and (slow
tier) the vLLM engine with the defaults.

The two ranks get trajectories of different lengths: the environment gives a row as many
attempts as its `max_turns` column says (arithmetic_retry's documented per-row setting), and
with the data in order the prompts rank 0 generates for allow one attempt, rank 1's three.
The random model never answers right, so rank 0's episodes are one model turn and rank 1's
three model turns with two observations between them.

Asserted: two steps complete; each step's generation really was uneven between the ranks'
shares (turns and response lengths); observation tokens have mask 0; and the engine/trainer
log-prob gap over model tokens (`rollout/logp_abs_diff_mean` / `_max`, the engine's
log-probs against the FSDP actor's old log-prob pass) stays <= 1e-3 in every step, which
needs the weight sync and the token-in-token-out assembly of the turns to be right on both
ranks.
"""

from __future__ import annotations

import math

import pytest

from tests.integration.checkpoint_helpers import run_config, train

pytestmark = pytest.mark.integration

MT = "actor_rollout_ref.rollout.multi_turn"
TURNS_OF_RANK = (1, 3)  # attempts per row for the prompts of rank 0 and of rank 1
PROMPTS_PER_STEP = 4  # data.train_batch_size in run_config: 2 prompts per rank
GAP_FP32 = 1e-3


@pytest.fixture(scope="module")
def uneven_files(tmp_path_factory):
    """The arithmetic rows with a `max_turns` column: in each batch of 4 (read in order), the
    first 2 prompts (rank 0's share of the generation) get 1 attempt, the other 2 get 3."""
    import pandas as pd

    from hybrid.arithmetic_task import write_arithmetic_parquet

    out = tmp_path_factory.mktemp("arith_mt_ranks")
    files = write_arithmetic_parquet(out / "source", n_train=8, n_val=4, seed=11)
    paths = {}
    for split, path in files.items():
        frame = pd.read_parquet(path)
        half = PROMPTS_PER_STEP // 2
        frame["max_turns"] = [TURNS_OF_RANK[(i % PROMPTS_PER_STEP) >= half] for i in range(len(frame))]
        paths[split] = out / f"{split}.parquet"
        frame.to_parquet(paths[split])
    return paths


@pytest.fixture(scope="module")
def ray_session():
    import ray

    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    yield
    ray.shutdown()


CASES = {
    # No rebalancing: the update's shares are the generation's, uneven too, and each rank
    # cuts its rows into micro-batches by a token budget (dynamic batch size).
    "hf_unbalanced_dynamic_bsz": [
        "actor_rollout_ref.rollout.name=hf",
        "trainer.balance_batch=false",
        "actor_rollout_ref.actor.use_dynamic_bsz=true",
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=130",  # one sequence fits: 64 + 64
    ],
    # As the example runs: the vLLM engine, rows rebalanced over the ranks before the update.
    "vllm": ["actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.max_num_batched_tokens=512"],
}


@pytest.mark.parametrize("case", ["hf_unbalanced_dynamic_bsz", pytest.param("vllm", marks=pytest.mark.slow)])
def test_two_ranks_with_uneven_trajectories(case, ray_session, tiny_model_dir, uneven_files, tmp_path, monkeypatch):
    from hybrid.rollouts import Rollouts

    cfg = run_config(
        tiny_model_dir,
        uneven_files,
        tmp_path / "run",
        *CASES[case],
        "trainer.n_gpus_per_node=2",
        "trainer.worker_group=ray",
        "trainer.total_training_steps=2",
        "algorithm.adv_estimator=grpo",
        "data.shuffle=false",
        "data.max_response_length=64",  # 3 turns of <= 6 tokens + 2 observations of 17 tokens fit
        "actor_rollout_ref.actor.use_kl_loss=true",
        "actor_rollout_ref.actor.optim.lr=1e-2",  # an engine left with stale weights is far off the bound
        f"{MT}.enable=true",
        f"{MT}.env_class=arithmetic_retry",
        f"{MT}.max_assistant_turns=3",
        f"{MT}.max_tokens_per_turn=6",
    )
    assert cfg.actor_rollout_ref.actor.fsdp_config.mixed_precision == "fp32"
    generated = []
    generate = Rollouts.generate

    def recording(self, gen_batch):
        out = generate(self, gen_batch)
        generated.append(out)
        return out

    monkeypatch.setattr(Rollouts, "generate", recording)
    out = train(cfg)

    assert out["result"]["steps"] == 2
    assert [h["step"] for h in out["history"]] == [1, 2]
    assert len(generated) == 2
    for step, (batch, metrics) in enumerate(zip(generated, out["history"]), start=1):
        check_uneven_shares(batch, step)
        for key in ("rollout/logp_abs_diff_mean", "rollout/logp_abs_diff_max"):
            value = metrics[key]
            assert math.isfinite(value) and value <= GAP_FP32, (step, key, value)
        assert math.isfinite(metrics["actor/pg_loss"]) and math.isfinite(metrics["actor/kl_loss"]), step


def check_uneven_shares(batch, step: int) -> None:
    """The driver concatenates the ranks' outputs in rank order (DP_COMPUTE_PROTO chunks the
    prompts): the first half of the rows is rank 0's share, the second half rank 1's."""
    rows = len(batch)
    assert rows == PROMPTS_PER_STEP * 2, rows  # rollout.n = 2
    turns = [int(t) for t in batch.non_tensor_batch["multi_turn_turns"]]
    mask = batch.batch["response_mask"]
    attended = batch.batch["attention_mask"][:, -mask.shape[1] :]
    lengths = attended.sum(-1).tolist()  # model and observation tokens
    shares = [slice(0, rows // 2), slice(rows // 2, rows)]
    assert all(t == TURNS_OF_RANK[0] for t in turns[shares[0]]), (step, turns)
    # A random model answers wrong, so rank 1's trajectories take every attempt they have.
    assert all(t == TURNS_OF_RANK[1] for t in turns[shares[1]]), (step, turns)
    assert max(lengths[shares[0]]) < min(lengths[shares[1]]), (step, lengths)
    for i in range(rows):
        observation = (attended[i] == 1) & (mask[i] == 0)
        assert bool(observation.any()) == (turns[i] > 1), (step, i, mask[i].tolist())
