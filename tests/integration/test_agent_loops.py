"""Agent loops (mode=async, workers/rollout/agent_rollout.py) on the real in-process vLLM
engine and the tiny random model: greedy decoding with deterministic environments gives
the lock-step loop's output token for token (multi-turn and single-turn); a slow
environment holds back only its own trajectory; an `async def step` is awaited; a step past
its time limit ends only its trajectory; a user's agent loop comes from a YAML file; the
bound on trajectories in flight holds; an unknown agent name is refused with its row."""

from __future__ import annotations

import asyncio
import dataclasses
import textwrap
import time

import numpy as np
import pytest
import torch

from reward.environments import BaseTextEnv, register_env
from tests.integration.engine_helpers import chat_batch, sharp_engine

pytestmark = pytest.mark.integration

R = "actor_rollout_ref.rollout"
MT = f"{R}.multi_turn"
# Long enough that row 0's wait stays over 0.3 of the summed latencies when the other rows'
# generation is slowed by a second test process on the same cores (make test runs two).
SLOW_S = 12.0
QUESTIONS = ["What is 2 + 3?", "Name a colour.", "Count to five.", "What is the capital of France?"]


@register_env("test_agent_env")
class AgentTestEnv(BaseTextEnv):
    """Deterministic: three observations, then done; rewards 0.5 per turn. env_kwargs.mode:
    "plain"; "slow" (row 0 sleeps SLOW_S in its first step); "stuck" (row 1 sleeps past the
    time limit)."""

    def step(self, action):
        self.turns += 1
        mode, row = self.env_config.mode, self.extras.get("index")
        if mode == "slow" and row == 0 and self.turns == 1:
            time.sleep(SLOW_S)
        if mode == "stuck" and row == 1:
            time.sleep(30)
        done = self.turns >= 3
        observations = [] if done else [{"role": "user", "content": f"Turn {self.turns}: say more."}]
        return {"observations": observations, "reward": 0.5, "done": done, "metadata": {}}


@register_env("test_async_env")
class AsyncStepEnv(BaseTextEnv):
    """An environment whose step is a coroutine (an async client, say)."""

    async def step(self, action):
        await asyncio.sleep(0.01)
        self.turns += 1
        done = self.turns >= 2
        observations = [] if done else [{"role": "user", "content": "Once more."}]
        return {"observations": observations, "reward": 1.0, "done": done, "metadata": {}}


@pytest.fixture(scope="module")
def engine(tiny_model_dir, tokenizer):
    rollout = sharp_engine(
        tiny_model_dir,
        tokenizer,
        f"{MT}.enable=true",
        f"{MT}.env_class=test_agent_env",
        f"{MT}.max_tokens_per_turn=8",
        f"{MT}.env_step_timeout_s=2",
        f"{MT}.tolerate_env_errors=true",
        f"{MT}.env_kwargs.mode=plain",
        response_length=64,
    )
    base = rollout.config
    yield rollout
    rollout.config = base


def _set(engine, multi_turn: dict | None = None, agent: dict | None = None, **rollout):
    """The engine with its rollout section changed (the engine itself is kept: the tests share it)."""
    config = engine.config
    if multi_turn:
        config = dataclasses.replace(config, multi_turn=dataclasses.replace(config.multi_turn, **multi_turn))
    if agent:
        config = dataclasses.replace(config, agent=dataclasses.replace(config.agent, **agent))
    engine.config = dataclasses.replace(config, **rollout)
    return engine


@pytest.fixture
def fresh(engine):
    base = engine.config
    yield engine
    engine.config = base
    engine.multi_turn = None


def _greedy_batch(tokenizer, **columns):
    batch = chat_batch(tokenizer, [[{"role": "user", "content": q}] for q in QUESTIONS], **columns)
    batch.meta_info["do_sample"] = False
    return batch


def _lock_step(engine, batch):
    from workers.rollout.step_wise import loop_for_engine

    engine.multi_turn = loop_for_engine(engine, None)
    return engine.generate_sequences(batch)


def _agents(engine, batch):
    from workers.rollout.agent_rollout import AgentRollout
    from workers.rollout.step_wise import loop_for_engine

    engine.multi_turn = loop_for_engine(engine, None)
    return AgentRollout(engine).generate_sequences(batch)


def _assert_same_rollout(a, b, fields=()):
    """The same tokens, masks and rewards exactly; the engine's log-probs within float noise
    (vLLM's kernels may sum in another order when the batch it steps is composed otherwise)."""
    assert sorted(a.batch.keys()) == sorted(b.batch.keys())
    for key in a.batch.keys():
        if key == "rollout_log_probs":
            torch.testing.assert_close(a.batch[key], b.batch[key], rtol=0, atol=1e-4)
        else:
            assert torch.equal(a.batch[key], b.batch[key]), key
    for key in fields:
        assert list(a.non_tensor_batch[key]) == list(b.non_tensor_batch[key]), key


def test_environment_agent_gives_the_lock_step_tokens(fresh, tokenizer):
    batch = _greedy_batch(tokenizer)
    lock_step = _lock_step(fresh, batch)
    agents = _agents(fresh, batch)
    turns = list(lock_step.non_tensor_batch["multi_turn_turns"])
    assert max(turns) >= 2, turns  # observations were appended: a real multi-turn comparison
    assert (lock_step.batch["response_mask"] == 0).any() and (lock_step.batch["response_mask"] == 1).any()
    _assert_same_rollout(
        lock_step,
        agents,
        fields=("multi_turn_turns", "multi_turn_finish_reason", "multi_turn_reward", "multi_turn_last_response"),
    )
    assert list(agents.non_tensor_batch["agent_turns"]) == turns
    metrics = agents.meta_info["metrics"]
    assert 1 <= metrics["agent/in_flight/max"] <= len(QUESTIONS)
    assert 0 < metrics["agent/engine_busy_share"] <= 1
    assert metrics["agent/latency_s/p95"] >= metrics["agent/latency_s/p50"] > 0


def test_step_wise_agents_give_the_lock_step_samples(fresh, tokenizer):
    """mode=async with step_wise_trajectories: the agent loops build the lock-step loop's samples
    (one per model turn, each prompt the history rendered again) token for token."""
    from workers.rollout.step_wise import STEP_WISE_LAST

    _set(fresh, multi_turn={"step_wise_trajectories": True})
    batch = _greedy_batch(tokenizer)
    lock_step = _lock_step(fresh, batch)
    agents = _agents(fresh, batch)
    last = lock_step.batch[STEP_WISE_LAST].tolist()
    turns = [t for t, is_last in zip(lock_step.non_tensor_batch["multi_turn_turns"], last) if is_last]
    assert len(turns) == len(QUESTIONS) and len(lock_step) == sum(turns) > len(QUESTIONS)
    _assert_same_rollout(lock_step, agents, fields=("multi_turn_turns", "multi_turn_reward"))
    assert list(agents.non_tensor_batch["agent_turns"]) == list(lock_step.non_tensor_batch["multi_turn_turns"])


def test_single_turn_agent_gives_the_batched_generate_tokens(fresh, tokenizer):
    _set(fresh, multi_turn={"enable": False})
    batch = _greedy_batch(tokenizer)
    sync = fresh.generate_sequences(batch)
    agents = _agents(fresh, batch)
    assert "env_rewards" not in agents.batch.keys()
    _assert_same_rollout(sync, agents)
    assert (agents.batch["response_mask"].sum(-1) > 1).all()


def test_a_slow_environment_holds_back_only_its_trajectory(fresh, tokenizer):
    _set(fresh, multi_turn={"env_kwargs": {"mode": "slow"}, "env_step_timeout_s": 30.0})
    start = time.perf_counter()
    out = _agents(fresh, _greedy_batch(tokenizer))
    wall = time.perf_counter() - start
    latency = list(out.non_tensor_batch["agent_latency_s"])
    # Row 0 waits SLOW_S in its first step; every other trajectory ends before that returns.
    assert latency[0] >= SLOW_S
    assert max(latency[1:]) < SLOW_S, latency
    assert wall < SLOW_S + min(latency[1:]) + 5  # not the lock-step's sum of waits
    assert out.meta_info["metrics"]["agent/env_wait_share"] > 0.3
    assert list(out.non_tensor_batch["multi_turn_finish_reason"]) == ["done"] * len(QUESTIONS)


def test_an_async_step_is_awaited(fresh, tokenizer):
    _set(fresh, multi_turn={"env_class": "test_async_env"})
    out = _agents(fresh, _greedy_batch(tokenizer))
    assert list(out.non_tensor_batch["multi_turn_finish_reason"]) == ["done"] * len(QUESTIONS)
    assert list(out.non_tensor_batch["multi_turn_reward"]) == [2.0] * len(QUESTIONS)


def test_a_stuck_step_ends_only_its_trajectory(fresh, tokenizer):
    _set(fresh, multi_turn={"env_kwargs": {"mode": "stuck"}})
    start = time.perf_counter()
    out = _agents(fresh, _greedy_batch(tokenizer))
    assert time.perf_counter() - start < 20  # the 2 s limit, not the 30 s sleep
    reasons = list(out.non_tensor_batch["multi_turn_finish_reason"])
    errors = list(out.non_tensor_batch["multi_turn_error"])
    assert reasons[1] == "error" and errors[1].startswith("timeout")
    assert [r for i, r in enumerate(reasons) if i != 1] == ["done"] * 3


def test_a_user_agent_loop_from_a_file_and_the_in_flight_bound(fresh, tokenizer, tmp_path):
    (tmp_path / "my_agents.py").write_text(
        textwrap.dedent(
            """
            from workers.rollout.agent_loop import AgentLoop

            class TwoShots(AgentLoop):
                # Two model turns with a fixed nudge between them; the nudge is not trained on.
                def __init__(self, rollout, nudge):
                    super().__init__(rollout)
                    self.nudge = nudge

                async def run(self, trajectory, call):
                    trajectory.prompt_ids = self.dataset_prompt_ids(trajectory, call)
                    nudge = self.tokenizer(self.nudge, add_special_tokens=False)["input_ids"]
                    for turn_index in range(2):
                        turn = await self.generate(trajectory.prompt_ids + trajectory.response_ids, 4, call)
                        trajectory.response_ids += turn.token_ids
                        trajectory.mask += [1] * len(turn.token_ids)
                        trajectory.log_probs += turn.log_probs
                        trajectory.last_model_position = len(trajectory.response_ids) - 1
                        trajectory.turns += 1
                        if turn_index == 0:
                            trajectory.response_ids += nudge
                            trajectory.mask += [0] * len(nudge)
                            trajectory.log_probs += [0.0] * len(nudge)
                    trajectory.rewards.append((trajectory.last_model_position, 1.0))
                    trajectory.finish = "done"
            """
        )
    )
    (tmp_path / "agents.yaml").write_text(
        "- name: two_shots\n  path: my_agents.py\n  class_name: TwoShots\n  nudge: ' Hmm.'\n"
    )
    _set(fresh, agent={"agent_loop_config_path": str(tmp_path / "agents.yaml"), "max_trajectories_in_flight": 2})
    names = np.array(["two_shots", "environment_agent", "two_shots", "environment_agent"], dtype=object)
    out = _agents(fresh, _greedy_batch(tokenizer, agent_name=names))
    nudge = tokenizer(" Hmm.", add_special_tokens=False)["input_ids"]
    for row in (0, 2):
        mask = out.batch["response_mask"][row].tolist()
        used = mask.index(0) if 0 in mask else len(mask)
        assert used <= 4 and mask[used : used + len(nudge)] == [0] * len(nudge)
        assert out.batch["responses"][row, used : used + len(nudge)].tolist() == nudge
        assert out.non_tensor_batch["agent_turns"][row] == 2
    assert out.non_tensor_batch["multi_turn_finish_reason"][1] == "done"
    assert out.meta_info["metrics"]["agent/in_flight/max"] <= 2


def test_an_unknown_agent_name_is_refused_with_its_row(fresh, tokenizer):
    names = np.array(["single_turn_agent", "react_agent", "single_turn_agent", "single_turn_agent"], dtype=object)
    with pytest.raises(
        ValueError, match=r"batch row 1: agent_name='react_agent' is not an agent loop; known: .*tool_agent"
    ):
        _agents(fresh, _greedy_batch(tokenizer, agent_name=names))


def test_an_openai_client_agent_trains_on_the_engines_tokens(fresh, tokenizer, tmp_path):
    """A tool-using agent written against the `openai` client: every row's trained tokens are
    the last engine input plus its output, mask 1 exactly on the engine's sampled ids, the
    engine's log-probs on them, the agent's reward on the last model token."""
    (tmp_path / "tool_agent.py").write_text(
        textwrap.dedent(
            """
            from workers.rollout.openai_agent import OpenAIAgentLoop

            class Calculator(OpenAIAgentLoop):
                async def run_agent(self, client, row):
                    messages = [dict(m) for m in row["raw_prompt"]]
                    for turn in range(3):
                        reply = await client.chat.completions.create(model="p", messages=messages, max_tokens=5)
                        messages.append({"role": "assistant", "content": reply.choices[0].message.content})
                        if turn < 2:
                            messages.append({"role": "tool", "content": f"calculator says {turn + 40}"})
                    return 0.75
            """
        )
    )
    (tmp_path / "agents.yaml").write_text("- name: calculator\n  path: tool_agent.py\n  class_name: Calculator\n")
    agent = {"agent_loop_config_path": str(tmp_path / "agents.yaml"), "enable_http_endpoint": True}
    _set(fresh, agent={**agent, "default_agent_loop": "calculator", "http_endpoint_port": 0})
    calls = []
    from workers.rollout.async_engine import AsyncEngineDriver

    inner = AsyncEngineDriver.generate

    async def recording(self, prompt_ids, params):
        turn = await inner(self, prompt_ids, params)
        calls.append((list(prompt_ids), turn))
        return turn

    AsyncEngineDriver.generate = recording
    try:
        out = _agents(fresh, _greedy_batch(tokenizer))
    finally:
        AsyncEngineDriver.generate = inner
    assert len(calls) == 3 * len(QUESTIONS)
    width = out.batch["prompts"].shape[1]
    for row in range(len(QUESTIONS)):
        attention = out.batch["attention_mask"][row].bool()
        tokens = out.batch["input_ids"][row][attention].tolist()
        used = int(attention[width:].sum())
        mask = out.batch["response_mask"][row][:used].tolist()
        log_probs = out.batch["rollout_log_probs"][row][:used]
        last = [
            (ids, turn)
            for ids, turn in calls
            if tokens[: len(ids)] == ids and len(ids) + len(turn.token_ids) == len(tokens)
        ]
        assert len(last) == 1, row  # the sequence trained on is the last engine input + its output
        prompt_len = len(tokens) - used
        sampled = [
            position
            for ids, turn in calls
            if tokens[: len(ids)] == ids
            for position in range(len(ids), len(ids) + len(turn.token_ids))
        ]
        assert [i for i, m in enumerate(mask) if m] == [p - prompt_len for p in sampled]
        engine_lp = [lp for ids, turn in calls if tokens[: len(ids)] == ids for lp in turn.log_probs]
        assert torch.allclose(log_probs[torch.tensor(mask).bool()], torch.tensor(engine_lp), atol=1e-6)
        assert out.batch["env_rewards"][row].sum().item() == 0.75
        assert out.batch["env_rewards"][row, max(i for i, m in enumerate(mask) if m)].item() == 0.75
    assert list(out.non_tensor_batch["multi_turn_turns"]) == [3] * len(QUESTIONS)


def test_a_verifiers_environment_trains_on_the_engines_tokens_with_its_rubric_reward(fresh, tokenizer, tmp_path):
    """The verifiers_env agent loop: a verifiers environment (tests/integration/verifiers_helpers.py,
    loaded as an installed package by a hub-style id) plays each row's task through the endpoint.
    Each row trains on the last engine input plus its output, mask 1 exactly on the sampled ids
    with the engine's log-probs, the user's nudge masked; the reward on the last model token is the
    rubric computed by hand on the decoded last turn; the task is the row's example_id (from the
    SkyRL-style verifiers dict, else the example_id column), the environment the row's, else the key."""
    pytest.importorskip("verifiers.v1", reason="the verifiers extra: pip install -e '.[verifiers]'")
    from tests.integration.verifiers_helpers import NUDGE, TASKS, rubric, write_package

    write_package(tmp_path, "hybrid_toy_rubric")
    env_id = "someone/hybrid-toy-rubric@0.1.0"
    order = [2, 0, 3, 1]  # rows name tasks out of order
    chats = [[{"role": "user", "content": TASKS[i][0]}] for i in order]
    specs = [{"environment": env_id, "example_id": order[0], "answer": TASKS[order[0]][1]}, {"environment": env_id}]
    specs += [{"answer": TASKS[i][1]} for i in order[2:]]  # environment from the key
    agent = {"enable_http_endpoint": True, "http_endpoint_port": 0, "verifiers_env": "hybrid_toy_rubric"}
    _set(fresh, agent=agent)
    calls = []
    from workers.rollout.async_engine import AsyncEngineDriver

    inner = AsyncEngineDriver.generate

    async def recording(self, prompt_ids, params):
        turn = await inner(self, prompt_ids, params)
        calls.append((list(prompt_ids), turn))
        return turn

    import sys

    AsyncEngineDriver.generate = recording
    sys.path.insert(0, str(tmp_path))
    try:
        batch = chat_batch(tokenizer, chats, verifiers=specs, example_id=order)
        out = _agents(fresh, batch)
    finally:
        AsyncEngineDriver.generate = inner
        sys.path.remove(str(tmp_path))
        sys.modules.pop("hybrid_toy_rubric", None)
    assert len(calls) == 2 * len(order)
    width = out.batch["prompts"].shape[1]
    nudge = tokenizer(NUDGE, add_special_tokens=False)["input_ids"]
    for row, task in enumerate(order):
        attention = out.batch["attention_mask"][row].bool()
        tokens = out.batch["input_ids"][row][attention].tolist()
        used = int(attention[width:].sum())
        prompt = tokens[: len(tokens) - used]
        text = tokenizer.apply_chat_template(chats[row], add_generation_prompt=True, tokenize=False)
        assert prompt == tokenizer(text, add_special_tokens=False)["input_ids"]  # the task's prompt
        mine = [(ids, turn) for ids, turn in calls if tokens[: len(ids)] == ids]
        assert len(mine) == 2 and len(mine[-1][0]) + len(mine[-1][1].token_ids) == len(tokens), row
        mask = out.batch["response_mask"][row][:used].tolist()
        sampled = [p - len(prompt) for ids, turn in mine for p in range(len(ids), len(ids) + len(turn.token_ids))]
        assert [i for i, m in enumerate(mask) if m] == sampled
        observation = [t for t, m in zip(tokens[len(prompt) :], mask) if not m]
        assert any(observation[i : i + len(nudge)] == nudge for i in range(len(observation)))
        engine_lp = [lp for _, turn in mine for lp in turn.log_probs]
        log_probs = out.batch["rollout_log_probs"][row][:used]
        assert torch.allclose(log_probs[torch.tensor(mask).bool()], torch.tensor(engine_lp), atol=1e-6)
        reply = tokenizer.decode(mine[-1][1].token_ids, skip_special_tokens=True)
        expected = rubric(TASKS[task][1], reply)
        assert out.batch["env_rewards"][row].sum().item() == pytest.approx(expected, abs=1e-6)
        assert out.batch["env_rewards"][row, max(i for i, m in enumerate(mask) if m)].item() == pytest.approx(expected)
    assert list(out.non_tensor_batch["multi_turn_turns"]) == [2] * len(order)


def test_a_verifiers_episode_past_the_budget_ends_with_length_and_no_reward(fresh, tokenizer, tmp_path):
    """A response budget (12 tokens) that the nudge after the first 5-token turn overruns: the
    endpoint ends each session (400 context_length_exceeded to the harness), the trajectory ends
    with finish reason length, keeps its first turn (mask 1) and gets no reward."""
    pytest.importorskip("verifiers.v1", reason="the verifiers extra: pip install -e '.[verifiers]'")
    import sys

    from tests.integration.verifiers_helpers import TASKS, write_package

    write_package(tmp_path, "hybrid_toy_budget")
    chats = [[{"role": "user", "content": question}] for question, _ in TASKS]
    agent = {"enable_http_endpoint": True, "http_endpoint_port": 0, "verifiers_env": "hybrid_toy_budget"}
    _set(fresh, agent=agent, response_length=12)
    sys.path.insert(0, str(tmp_path))
    try:
        out = _agents(fresh, chat_batch(tokenizer, chats, example_id=list(range(len(TASKS)))))
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("hybrid_toy_budget", None)
    assert list(out.non_tensor_batch["multi_turn_finish_reason"]) == ["length"] * len(TASKS)
    assert list(out.non_tensor_batch["multi_turn_turns"]) == [1] * len(TASKS)
    assert out.batch["env_rewards"].abs().sum().item() == 0.0
    for mask in out.batch["response_mask"]:  # the first turn only: up to its 5 tokens, then nothing
        kept = int(mask.sum())
        assert 1 <= kept <= 5 and mask[:kept].all()
