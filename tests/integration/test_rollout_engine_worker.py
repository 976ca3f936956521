"""Rollout engines in their own Ray actors (workers/rollout_engine_worker.py) fed by the training
group's `export_weights` (asynchronous training), on the tiny random model in fp32:

- the engine samples from exactly the trainer's weights after a load (its log-probs equal the
  trainer's `compute_log_prob`), and every sample carries the version loaded;
- after an update, export + load gives the new policy (log-probs equal the updated trainer's,
  not the old weights'); calls made at once share the engine's batches;
- a load while multi-turn agent loops are in flight: without abort every request finishes and
  a trajectory's turns carry the version that sampled them, old then new; with abort the turns
  in flight are sampled again on the new weights, nothing of them kept, no trajectory lost.
  Each model token's log-prob is checked against a Hugging Face model holding the weights of
  the version it is stamped with;
- two training ranks export the same weights as one, round after round;
- a mode=sync engine (in process) serves one batched call at a time, a load waiting for it;
- the actor_ref role builds the actor and the reference without an engine, and exports.
"""

from __future__ import annotations

import asyncio
import textwrap
import time

import numpy as np
import pytest
import torch

from protocol.data_proto import DataProto
from tests.integration.engine_helpers import (
    chat_batch,
    engine_config,
    logp_update_logp,
    prompt_batch,
    sharp_weights,
    synthetic_rollout,
    with_advantages,
)

pytestmark = pytest.mark.integration

R = "actor_rollout_ref.rollout"
MT = f"{R}.multi_turn"
FP32_TOL = 1e-3
TURN = 48  # tokens per model turn (ignore_eos: every turn its whole budget)
RESPONSE = 200  # 3 turns + 2 observations fit
STEP_S = 0.5  # each environment step's delay
QUESTIONS = ["What is 2 + 3?", "Name a colour.", "Count to five.", "What is the capital of France?"]

ENV_FILE = '''
import time

from reward.environments import BaseTextEnv


class SlowEnv(BaseTextEnv):
    """Three model turns; each step takes {delay} s, so a trajectory spans a weight load."""

    def step(self, action):
        time.sleep({delay})
        self.turns += 1
        done = self.turns >= 3
        observations = [] if done else [{{"role": "user", "content": f"Turn {{self.turns}}: say more."}}]
        return {{"observations": observations, "reward": 0.5, "done": done, "metadata": {{}}}}
'''


@pytest.fixture(scope="module")
def ray_cluster():
    import ray

    # Logical CPUs: up to 3 training ranks and an engine actor share the machine's cores.
    ray.init(num_cpus=4, include_dashboard=False, logging_level="ERROR")
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def env_file(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("env") / "slow_env.py"
    path.write_text(textwrap.dedent(ENV_FILE.format(delay=STEP_S)))
    return str(path)


def job_config(model_dir: str, env_file: str, *extra: str, ranks: int = 1):
    """Agent loops (mode=async) over a multi-turn environment whose steps take STEP_S; rows
    with agent_name=single_turn_agent sample one turn. Sampling at temperature 1."""
    return engine_config(
        model_dir,
        f"{R}.temperature=1.0",
        f"{R}.load_format=dummy_dtensor",
        f"{R}.mode=async",
        f"{R}.ignore_eos=true",
        "data.max_prompt_length=48",
        f"{MT}.enable=true",
        f"{MT}.env_class={env_file}:SlowEnv",
        f"{MT}.max_tokens_per_turn={TURN}",
        f"{MT}.env_step_timeout_s=30",
        *extra,
        response_length=RESPONSE,
        ranks=ranks,
    )


def training_group(config, ranks: int):
    """An actor-role group of `ranks` Ray ranks, in a placement group of its own name."""
    from hybrid.controller.ray_worker_group import RayResourcePool, RayWorkerGroup
    from workers.actor_rollout_ref_worker import ActorRolloutRefWorker

    name = f"trainer{ranks}"
    pool = RayResourcePool(nnodes=1, slots_per_node=ranks, use_gpu=False, cpus_per_slot=1, name=name)
    group = RayWorkerGroup(pool, ActorRolloutRefWorker, config.actor_rollout_ref, role="actor", name=name)
    group.pool = pool
    group.init_model()
    return group


@pytest.fixture(scope="module")
def engine(ray_cluster, tiny_model_dir, env_file):
    import ray

    from workers.rollout_engine_worker import RolloutEngineWorker

    config = job_config(tiny_model_dir, env_file).actor_rollout_ref
    actor = ray.remote(RolloutEngineWorker).options(num_cpus=1, max_concurrency=64).remote(config)
    started = actor.init_engine.remote()  # builds while the trainer does
    yield actor, started
    ray.kill(actor, no_restart=True)


@pytest.fixture(scope="module")
def trainer(ray_cluster, tiny_model_dir, env_file, engine):
    import ray

    group = training_group(job_config(tiny_model_dir, env_file), 1)
    assert ray.get(engine[1]) == {"dtype": "float32", "version": -1}
    yield group
    group.shutdown()
    group.pool.remove()


def _column(values):
    array = np.empty(len(values), dtype=object)
    array[:] = values
    return array


def _single_turn(tokenizer) -> DataProto:
    batch = prompt_batch(tokenizer, max_len=48)
    batch.non_tensor_batch["agent_name"] = _column(["single_turn_agent"] * len(batch))
    return batch


def _push(group, actor, version: int, as_exported: bool = False) -> tuple:
    """Export from the training group, load into the engine: (ObjectRef, export s, load s).
    `as_exported`: rank 0's one-element list passed on as it is (the engine resolves it)."""
    import ray

    start = time.perf_counter()
    exported = group.export_weights("float32")
    (ref,) = exported[0]
    assert all(rank is None for rank in exported[1:])
    export_s = time.perf_counter() - start
    load_s = ray.get(actor.load_weights.remote(version, exported[0] if as_exported else ref))
    return ref, export_s, load_s


def _pairs(ref) -> dict[str, torch.Tensor]:
    import ray

    return {name: tensor.clone() for name, tensor in ray.get(ref)}


@pytest.fixture(scope="module")
def history(trainer, engine, tokenizer):
    """Two rounds on one training rank: v1 (the folder's weights) exported, loaded, sampled;
    an update on those samples; v2 exported, loaded, sampled. Read back from the object store
    after the loads, the weights also show the engine left them as they were."""
    import ray

    actor, _ = engine
    rounds = {}
    batch = _single_turn(tokenizer)
    for version in (1, 2):
        digest = trainer.weights_digest()
        ref, export_s, load_s = _push(trainer, actor, version)
        out = ray.get(actor.generate.remote(batch))
        log_probs = trainer.compute_log_prob(out).batch["old_log_probs"]
        rounds[version] = dict(weights=_pairs(ref), out=out, log_probs=log_probs, digest=digest, s=(export_s, load_s))
        if version == 1:
            rounds["update"] = with_advantages(out.union(DataProto.from_dict({"old_log_probs": log_probs})), seed=0)
            trainer.update_actor(rounds["update"])
    return rounds


def _gap(out: DataProto, log_probs: torch.Tensor) -> torch.Tensor:
    """|log_probs - the engine's| on the response tokens."""
    return (log_probs - out.batch["rollout_log_probs"]).abs()[out.batch["response_mask"].bool()]


def reference_log_probs(model_dir, weights: dict[str, torch.Tensor], out: DataProto) -> torch.Tensor:
    """Per response token, its log-prob under `weights`, by a Hugging Face model in this process."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    missing, _ = model.load_state_dict(weights, strict=False)
    assert not missing, missing
    responses = out.batch["responses"]
    with torch.no_grad():
        logits = model(
            input_ids=out.batch["input_ids"],
            attention_mask=out.batch["attention_mask"],
            position_ids=out.batch["position_ids"],
        ).logits[:, -responses.shape[1] - 1 : -1]
    return torch.log_softmax(logits.float(), -1).gather(-1, responses.unsqueeze(-1)).squeeze(-1)


def test_engine_samples_the_exported_weights_stamped_with_their_version(history):
    out = history[1]["out"]
    mask = out.batch["response_mask"].bool()
    assert mask.sum() >= len(out)
    gap = _gap(out, history[1]["log_probs"])
    assert gap.mean() <= FP32_TOL and gap.max() <= 10 * FP32_TOL, f"mean {gap.mean():.2e} max {gap.max():.2e}"
    assert list(out.non_tensor_batch["policy_version"]) == [1] * len(out)
    versions = out.batch["rollout_versions"]
    assert versions.dtype == torch.int64 and versions.shape == mask.shape
    assert (versions[mask] == 1).all() and (versions[~mask] == -1).all()
    export_s, load_s = history[1]["s"]
    print(f"tiny model fp32: export {export_s:.3f} s, load {load_s:.3f} s")


def test_an_update_reaches_the_engine_as_the_next_version(history, tiny_model_dir):
    assert history[2]["digest"] != history[1]["digest"], "update_actor did not change the weights"
    out = history[2]["out"]
    gap = _gap(out, history[2]["log_probs"])
    assert gap.mean() <= FP32_TOL, f"engine vs updated trainer: {gap.mean():.2e}"
    # The same samples under the version-1 weights: the engine no longer serves those.
    stale = _gap(out, reference_log_probs(tiny_model_dir, history[1]["weights"], out))
    assert stale.mean() > 10 * FP32_TOL, f"the engine still samples version 1: {stale.mean():.2e}"
    assert list(out.non_tensor_batch["policy_version"]) == [2] * len(out)
    assert (out.batch["rollout_versions"][out.batch["response_mask"].bool()] == 2).all()


def test_concurrent_calls_share_the_engine(history, engine, trainer, tokenizer):
    """Three calls at once on the actor's loop: their requests share the engine's batches
    (alone, each takes RESPONSE steps: ignore_eos), and each samples the loaded policy."""
    import ray

    actor, _ = engine
    steps = ray.get(actor.stats.remote())["engine_steps"]
    outs = ray.get([actor.generate.remote(_single_turn(tokenizer)) for _ in range(3)])
    taken = ray.get(actor.stats.remote())["engine_steps"] - steps
    assert RESPONSE <= taken < 1.5 * RESPONSE, f"{taken} engine steps for 3 calls of {RESPONSE} tokens"
    for out in outs:
        assert list(out.non_tensor_batch["policy_version"]) == [2] * len(out)
        assert _gap(out, trainer.compute_log_prob(out).batch["old_log_probs"]).mean() <= FP32_TOL


@pytest.fixture(scope="module")
def policies(tiny_model_dir) -> dict[str, dict[str, torch.Tensor]]:
    """Two very different weight sets (the folder's, and its layers scaled up): a token
    stamped with the wrong one cannot pass the reference check."""
    from transformers import AutoModelForCausalLM

    plain = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).state_dict()
    return {"plain": dict(plain), "sharp": sharp_weights(tiny_model_dir)}


def _load_mid_flight(actor, tokenizer, version: int, weights: dict, abort: bool) -> DataProto:
    """Multi-turn trajectories; `weights` loaded as `version` while every first turn is in the engine."""
    import ray

    from workers.weight_sync import SharedWeights

    batch = chat_batch(tokenizer, [[{"role": "user", "content": q}] for q in QUESTIONS], width=48)
    batch.meta_info["n"] = 1
    pending = actor.generate.remote(batch)
    deadline = time.monotonic() + 60
    while (stats := ray.get(actor.stats.remote()))["requests_in_flight"] < len(QUESTIONS):
        assert time.monotonic() < deadline, "the trajectories never reached the engine"
        time.sleep(0.002)
    # Queued requests enter the engine before its next step: two steps on, all are in it.
    while ray.get(actor.stats.remote())["engine_steps"] < stats["engine_steps"] + 2:
        time.sleep(0.002)
    ray.get(actor.load_weights.remote(version, ray.put(SharedWeights.from_pairs(weights.items())), abort=abort))
    return ray.get(pending)


def _turns(out: DataProto, row: int) -> list[tuple[int, int]]:
    """(version, tokens) of each model turn of a sample (its runs of response mask 1); a turn
    holding two versions fails."""
    mask, versions = out.batch["response_mask"][row].tolist(), out.batch["rollout_versions"][row].tolist()
    turns: list[list[int]] = []
    for i, (m, v) in enumerate(zip(mask, versions)):
        if m and (i == 0 or not mask[i - 1]):
            turns.append([v, 0])
        if m:
            assert v == turns[-1][0], f"row {row}: one turn holds versions {turns[-1][0]} and {v}"
            turns[-1][1] += 1
    return [(v, n) for v, n in turns]


def _assert_tokens_match_their_versions(out: DataProto, weights_by_version: dict, model_dir) -> None:
    """Every model token's engine log-prob is its stamped version's (a reference model's)."""
    mask, versions = out.batch["response_mask"].bool(), out.batch["rollout_versions"]
    assert set(versions[mask].tolist()) <= set(weights_by_version)
    for version, weights in weights_by_version.items():
        stamped = mask & (versions == version)
        if stamped.any():
            ref = reference_log_probs(model_dir, weights, out)
            gap = (ref - out.batch["rollout_log_probs"]).abs()[stamped]
            assert gap.max() <= 10 * FP32_TOL, f"version {version}: max |engine - reference| {gap.max():.2e}"


def test_load_without_abort_lets_requests_finish_and_later_turns_take_new_weights(
    engine, tokenizer, tiny_model_dir, policies, history
):
    import ray

    actor, _ = engine
    ray.get(actor.load_weights.remote(10, policies["plain"]))
    out = _load_mid_flight(actor, tokenizer, 11, policies["sharp"], abort=False)
    assert list(out.non_tensor_batch["multi_turn_finish_reason"]) == ["done"] * len(QUESTIONS)
    assert list(out.non_tensor_batch["agent_aborted_turns"]) == [0] * len(QUESTIONS)
    _assert_tokens_match_their_versions(out, {10: policies["plain"], 11: policies["sharp"]}, tiny_model_dir)
    for row in range(len(out)):
        turns = _turns(out, row)
        # The first turn finished on the old weights (the load waited for it); the
        # environment's delay put the later ones after the load.
        assert turns == [(10, TURN), (11, TURN), (11, TURN)], f"row {row}: {turns}"
        assert out.non_tensor_batch["policy_version"][row] == 10


def test_load_with_abort_samples_the_turns_in_flight_again_on_new_weights(
    engine, tokenizer, tiny_model_dir, policies, history
):
    import ray

    actor, _ = engine
    ray.get(actor.load_weights.remote(12, policies["plain"]))
    aborted_before = ray.get(actor.stats.remote())["aborted_turns"]
    out = _load_mid_flight(actor, tokenizer, 13, policies["sharp"], abort=True)
    aborted = list(out.non_tensor_batch["agent_aborted_turns"])
    assert len(out) == len(QUESTIONS)  # every trajectory started has finished
    assert list(out.non_tensor_batch["multi_turn_finish_reason"]) == ["done"] * len(QUESTIONS)
    assert aborted == [1] * len(QUESTIONS), aborted  # each first turn was in the engine
    assert ray.get(actor.stats.remote())["aborted_turns"] - aborted_before == len(QUESTIONS)
    _assert_tokens_match_their_versions(out, {12: policies["plain"], 13: policies["sharp"]}, tiny_model_dir)
    for row in range(len(out)):
        # Sampled again from its prompt on the new weights; a partial turn kept would make a
        # turn longer than its budget, or put old-weight tokens under the new version.
        assert _turns(out, row) == [(13, TURN)] * 3
        assert out.non_tensor_batch["policy_version"][row] == 13


def test_two_training_ranks_export_what_one_rank_does(engine, tiny_model_dir, env_file, history, tokenizer):
    import ray

    actor, _ = engine
    group = training_group(job_config(tiny_model_dir, env_file, ranks=2), 2)
    try:
        for version in (1, 2):
            ref, _, _ = _push(group, actor, 20 + version, as_exported=version == 2)
            two, one = _pairs(ref), history[version]["weights"]
            assert list(two) == list(one)  # the same names in the same order (tied embeddings under both)
            for name in one:
                torch.testing.assert_close(two[name], one[name], rtol=0, atol=1e-5, msg=name)
            out = ray.get(actor.generate.remote(_single_turn(tokenizer)))
            assert _gap(out, group.compute_log_prob(out).batch["old_log_probs"]).mean() <= FP32_TOL
            assert list(out.non_tensor_batch["policy_version"]) == [20 + version] * len(out)
            if version == 1:
                group.update_actor(history["update"])
    finally:
        group.shutdown()
        group.pool.remove()


def test_a_sync_engine_serves_one_batched_call_at_a_time(tiny_model_dir, env_file, tokenizer, history):
    """mode=sync, in process: a call, a second call, then a load, at once: the load waits for
    the call in progress and goes before the one queued (which then samples the new weights);
    each call's samples carry the one version that sampled them."""
    from workers.rollout_engine_worker import RolloutEngineWorker

    worker = RolloutEngineWorker(
        job_config(tiny_model_dir, env_file, f"{R}.mode=sync", f"{MT}.enable=false").actor_rollout_ref, 7
    )
    worker.init_engine()
    batch = prompt_batch(tokenizer, max_len=48)

    async def calls():
        with pytest.raises(RuntimeError, match="holds no policy weights"):
            await worker.generate(batch)
        await worker.load_weights(1, list(history[1]["weights"].items()))
        first = asyncio.ensure_future(worker.generate(batch))
        await asyncio.sleep(0.1)  # the first call has the engine
        second = asyncio.ensure_future(worker.generate(batch))
        await asyncio.sleep(0.1)  # the second call waits for it
        load = asyncio.ensure_future(worker.load_weights(2, history[2]["weights"]))
        return await asyncio.gather(first, load, second)

    try:
        first, _, second = asyncio.run(calls())
    finally:
        worker.shutdown()
    assert first.meta_info["engine_index"] == 7
    for out, version in ((first, 1), (second, 2)):
        assert list(out.non_tensor_batch["policy_version"]) == [version] * len(out)
        mask = out.batch["response_mask"].bool()
        assert (out.batch["rollout_versions"][mask] == version).all()
        gap = _gap(out, reference_log_probs(tiny_model_dir, history[version]["weights"], out))
        assert gap.mean() <= FP32_TOL, f"version {version}: {gap.mean():.2e}"


def test_actor_ref_role_builds_no_engine_and_exports_copies(tiny_model_dir, tokenizer, monkeypatch):
    """In process without Ray: the pairs themselves, equal to the folder's weights in the
    asked dtype, not views of the live parameters (an update leaves them as they were)."""
    import ray
    from transformers import AutoModelForCausalLM

    from hybrid.controller.local_worker_group import LocalWorkerGroup
    from workers.actor_rollout_ref_worker import ActorRolloutRefWorker

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    config = engine_config(tiny_model_dir, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2")
    group = LocalWorkerGroup(ActorRolloutRefWorker, config.actor_rollout_ref, role="actor_ref")
    group.init_model()
    assert group.worker.rollout is None and group.worker.ref is not None
    folder = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).state_dict()
    (fp32,) = group.export_weights("float32")
    (bf16,) = group.export_weights("bfloat16")
    assert [name for name, _ in fp32] == list(folder) + (["lm_head.weight"] if "lm_head.weight" not in folder else [])
    for (name, tensor), (_, half) in zip(fp32, bf16):
        assert torch.equal(tensor, folder[name]) and half.dtype == torch.bfloat16
        assert torch.equal(half, folder[name].to(torch.bfloat16))
    batch = synthetic_rollout(tokenizer, n=2)
    reference = group.compute_ref_log_prob(batch).batch["ref_log_prob"]
    before, _, after_update = logp_update_logp(group, batch)
    mask = batch.batch["response_mask"].bool()
    assert (reference - before)[mask].abs().max() <= 1e-5  # the reference is the folder's policy
    assert (after_update - before)[mask].abs().max() > 1e-3
    (after,) = group.export_weights("float32")
    assert all(torch.equal(tensor, folder[name]) for name, tensor in fp32), "the export aliases the actor"
    assert any(not torch.equal(tensor, folder[name]) for name, tensor in after)
    with pytest.raises(ValueError, match="not a torch floating-point dtype"):
        group.export_weights("int8")
