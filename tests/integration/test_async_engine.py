"""AsyncEngineDriver on the in-process vLLM engine VLLMRollout builds (tiny random model):
concurrent coroutines get what the synchronous `generate_ids` gives, staggered requests
join a running batch, cancelling a coroutine aborts its request, a failing `step()` fails
every waiter and the driver refuses more, and `pause()` makes room for `reload_weights`
on the same engine, after which generation uses the new weights. One engine per module
(start-up takes most of the time); each test gets its own driver on it."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import threading

import pytest
import torch

from tests.conftest import build_tiny_model_dir
from tests.integration.engine_helpers import sharp_engine, sharp_weights

pytestmark = pytest.mark.integration

R = "actor_rollout_ref.rollout"
# The longest request: a cancelled one must still be running when it is cancelled.
RESPONSE_LENGTH = 200
LONG = 180


@pytest.fixture(scope="module")
def rollout(tiny_model_dir, tokenizer):
    return sharp_engine(tiny_model_dir, tokenizer, response_length=RESPONSE_LENGTH)


@pytest.fixture
def driver(rollout):
    from workers.rollout.async_engine import AsyncEngineDriver

    drv = AsyncEngineDriver(rollout.llm)
    yield drv
    drv.close()
    # Whatever a test did, nothing of it may stay in the engine the next test shares.
    assert not rollout.llm.llm_engine.has_unfinished_requests()


def _settings(rollout, max_tokens: int, **changes):
    from workers.rollout.base import sampling_settings

    greedy = sampling_settings(rollout.config, {"do_sample": False})
    return dataclasses.replace(greedy, max_tokens=max_tokens, **changes)


def _params(rollout, max_tokens: int, **changes):
    from workers.rollout.vllm_params import vllm_sampling_params

    return vllm_sampling_params(_settings(rollout, max_tokens, **changes))


def _prompts(count: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1000, 40000) for _ in range(rng.randrange(5, 30))] for _ in range(count)]


async def _until_steps(driver, steps: int, timeout: float = 60.0) -> None:
    """Waits until the driver has stepped the engine `steps` times since its stats were reset."""
    deadline = asyncio.get_running_loop().time() + timeout
    while driver.stats().steps < steps:
        assert asyncio.get_running_loop().time() < deadline, f"the driver did not reach {steps} steps"
        await asyncio.sleep(0.001)


def _sync(rollout, driver, prompts, budgets):
    """The reference: the engine's own synchronous call, inside a pause as the driver requires."""
    with driver.pause():
        return rollout.generate_ids(prompts, _settings(rollout, max(budgets)), budgets)


def _assert_same_turns(got, expected):
    for g, e in zip(got, expected, strict=True):
        assert g.token_ids == e.token_ids
        assert g.finish_reason == e.finish_reason
        assert g.log_probs == pytest.approx(e.log_probs, abs=1e-5)


def test_concurrent_greedy_requests_match_the_synchronous_engine(rollout, driver):
    prompts = _prompts(8)
    budgets = [8 + 3 * i for i in range(8)]

    async def run():
        return await asyncio.gather(*(driver.generate(p, _params(rollout, b)) for p, b in zip(prompts, budgets)))

    got = asyncio.run(run())
    expected = _sync(rollout, driver, prompts, budgets)
    # The comparison has teeth: different prompts give different, non-repeating continuations.
    assert len({tuple(t.token_ids) for t in expected}) == len(prompts)
    assert all(len(set(t.token_ids)) > len(t.token_ids) // 2 for t in expected)
    _assert_same_turns(got, expected)
    assert [len(t.token_ids) for t in got] == budgets  # no EOS from this model within these budgets


def test_staggered_requests_join_the_running_batch(rollout, driver):
    count, budget = 16, 64

    async def arrive(i, prompt):
        await asyncio.sleep(0.02 * i)
        return await driver.generate(prompt, _params(rollout, budget, ignore_eos=True))

    async def run():
        return await asyncio.gather(*(arrive(i, p) for i, p in enumerate(_prompts(count, seed=1))))

    driver.reset_stats()
    turns = asyncio.run(run())
    stats = driver.stats()
    assert [len(t.token_ids) for t in turns] == [budget] * count
    assert all(t.finish_reason == "length" for t in turns)
    assert stats.finished == count
    assert stats.max_in_flight > 1
    # One step samples a token for every running request: batching shows as fewer steps than tokens.
    assert stats.steps < count * budget
    assert 0 < stats.busy_s <= stats.wall_s
    assert 0 < stats.mean_in_flight <= stats.max_in_flight


def test_requests_from_two_event_loops_in_two_threads(rollout, driver):
    prompts = _prompts(4, seed=5)
    results = {}

    def loop_in_thread(part):
        async def run():
            return await asyncio.gather(*(driver.generate(p, _params(rollout, 12)) for p in prompts[part::2]))

        results[part] = asyncio.run(run())

    threads = [threading.Thread(target=loop_in_thread, args=(part,)) for part in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    expected = _sync(rollout, driver, prompts, [12] * len(prompts))
    _assert_same_turns(results[0], expected[0::2])
    _assert_same_turns(results[1], expected[1::2])


def test_cancelling_a_coroutine_aborts_its_request(rollout, driver):
    engine = rollout.llm.llm_engine
    prompts = _prompts(4, seed=2)

    async def run():
        long = asyncio.create_task(driver.generate(prompts[0], _params(rollout, LONG, ignore_eos=True)))
        short = [asyncio.create_task(driver.generate(p, _params(rollout, 16, ignore_eos=True))) for p in prompts[1:]]
        await _until_steps(driver, 4)
        assert engine.get_num_unfinished_requests() == 4
        long.cancel()
        turns = await asyncio.gather(*short)
        with pytest.raises(asyncio.CancelledError):
            await long
        return turns

    driver.reset_stats()
    turns = asyncio.run(run())
    assert [len(t.token_ids) for t in turns] == [16] * 3
    # The cancelled request left the batch: nothing runs on, and the engine did not take it to its end.
    assert engine.get_num_unfinished_requests() == 0
    assert driver.stats().steps < LONG
    assert driver.stats().finished == 3


class StepBroke(Exception):
    pass


def test_an_exception_in_step_fails_every_waiter_and_stops_the_driver(rollout, driver, monkeypatch):
    from workers.rollout.async_engine import AsyncEngineDriver

    engine = rollout.llm.llm_engine
    real_step = engine.step
    calls = []
    failure = StepBroke("the model raised in step 3")

    def step():
        calls.append(1)
        if len(calls) == 3:
            raise failure
        return real_step()

    monkeypatch.setattr(engine, "step", step)

    async def run():
        return await asyncio.gather(
            *(driver.generate(p, _params(rollout, 32, ignore_eos=True)) for p in _prompts(4, seed=3)),
            return_exceptions=True,
        )

    outcomes = asyncio.run(run())
    assert all(o is failure for o in outcomes), outcomes
    with pytest.raises(
        RuntimeError, match=r"engine failed \(StepBroke: the model raised in step 3\).*no more requests"
    ):
        asyncio.run(driver.generate(_prompts(1)[0], _params(rollout, 4)))
    # The requests it held were taken out of the engine.
    assert not engine.has_unfinished_requests()
    assert len(calls) == 3  # the dead driver stepped no more

    # The engine itself is fine: a new driver on it works.
    monkeypatch.undo()
    with AsyncEngineDriver(rollout.llm) as again:
        turn = asyncio.run(again.generate(_prompts(1)[0], _params(rollout, 4)))
    assert len(turn.token_ids) == 4


def test_refused_request_and_close(rollout, driver):
    from vllm.exceptions import VLLMValidationError

    from workers.rollout.async_engine import GenerationAborted

    async def run():
        # Longer than max_model_len: the engine refuses that request, the driver goes on.
        with pytest.raises(VLLMValidationError, match="maximum context length"):
            await driver.generate([1000] * 400, _params(rollout, 4))
        ok = await driver.generate(_prompts(1)[0], _params(rollout, 4))
        driver.reset_stats()
        long = asyncio.create_task(driver.generate(_prompts(1)[0], _params(rollout, LONG, ignore_eos=True)))
        await _until_steps(driver, 3)
        driver.close()
        driver.close()  # idempotent
        with pytest.raises(GenerationAborted, match="close"):
            await long
        with pytest.raises(RuntimeError, match="closed"):
            await driver.generate(_prompts(1)[0], _params(rollout, 4))
        return ok

    assert len(asyncio.run(run()).token_ids) == 4
    assert not rollout.llm.llm_engine.has_unfinished_requests()


def test_pause_with_abort_fails_requests_in_flight_distinctly(rollout, driver):
    from workers.rollout.async_engine import GenerationAborted

    engine = rollout.llm.llm_engine

    async def run():
        tasks = [asyncio.create_task(driver.generate(p, _params(rollout, LONG, ignore_eos=True))) for p in _prompts(3)]
        await _until_steps(driver, 3)
        with driver.pause(abort=True):
            assert engine.get_num_unfinished_requests() == 0
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        after = await driver.generate(_prompts(1)[0], _params(rollout, 4))
        return outcomes, after

    outcomes, after = asyncio.run(run())
    assert all(isinstance(o, GenerationAborted) for o in outcomes), outcomes
    assert len(after.token_ids) == 4


def _hf_log_probs(weights, model_dir, prompt, ids) -> list[float]:
    """A Hugging Face model with these weights: log-prob of each of `ids` after `prompt`."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    model.load_state_dict(weights)
    with torch.no_grad():
        logits = model(torch.tensor([prompt + ids])).logits[0].float()
    steps = logits[len(prompt) - 1 : -1].log_softmax(-1)
    return steps.gather(-1, torch.tensor(ids).unsqueeze(-1)).squeeze(-1).tolist()


def test_pause_lets_reload_weights_run_and_generation_uses_the_new_weights(
    rollout, driver, tokenizer, tiny_model_dir, tmp_path
):
    engine = rollout.llm.llm_engine
    prompts, budget = _prompts(4, seed=4), 24
    old = sharp_weights(tiny_model_dir)
    new = sharp_weights(build_tiny_model_dir(tmp_path / "seed1", tokenizer, seed=1))

    async def generate_all():
        return await asyncio.gather(*(driver.generate(p, _params(rollout, budget)) for p in prompts))

    async def run():
        before = await generate_all()
        in_flight = [asyncio.create_task(driver.generate(p, _params(rollout, 64, ignore_eos=True))) for p in prompts]
        await _until_steps(driver, 2)
        # Called on the event loop's thread: the engine thread finishes the requests without the loop.
        with driver.pause():
            assert engine.get_num_unfinished_requests() == 0
            queued = asyncio.create_task(generate_all())
            await asyncio.sleep(0.2)
            assert not queued.done() and engine.get_num_unfinished_requests() == 0  # held back while paused
            rollout.update_weights(new.items())  # collective_rpc("reload_weights") on this engine
            reference = rollout.generate_ids(prompts, _settings(rollout, budget), [budget] * len(prompts))
        finished = await asyncio.gather(*in_flight)
        return before, finished, await queued, reference

    try:
        before, finished, after, reference = asyncio.run(run())
    finally:
        with driver.pause():
            rollout.update_weights(old.items())
    assert [len(t.token_ids) for t in finished] == [64] * len(prompts)  # the pause let them finish
    _assert_same_turns(after, reference)
    assert all(a.token_ids != b.token_ids for a, b in zip(after, before))
    # Independent of vLLM: the new weights in a Hugging Face model give the same log-probs.
    for prompt, turn in zip(prompts, after):
        assert turn.log_probs == pytest.approx(_hf_log_probs(new, tiny_model_dir, prompt, turn.token_ids), abs=1e-3)
