"""OpenAIEndpoint on the in-process vLLM engine (tiny random model, as in test_async_engine):
the real `openai` client runs multi-turn tool-using agents whose session records hold
exactly the tokens the engine was fed and sampled; bad requests get OpenAI-shaped 4xx
errors while the server keeps serving; requests without a session leave no record; the
budget ends a session with "length"; a greedy turn through the endpoint equals the
engine's own `generate_ids`; a client that goes away, or a session taken mid-turn, leaves
no request in the engine. One engine and driver per module; each test its own endpoint."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import aiohttp
import pytest

from tests.integration.engine_helpers import sharp_engine

pytestmark = pytest.mark.integration

R = "actor_rollout_ref.rollout"
RESPONSE_LENGTH = 200
MAX_MODEL_LEN = 400
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluates an arithmetic expression.",
            "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
        },
    }
]


@pytest.fixture(scope="module")
def rollout(tiny_model_dir, tokenizer):
    return sharp_engine(
        tiny_model_dir, tokenizer, f"{R}.max_model_len={MAX_MODEL_LEN}", response_length=RESPONSE_LENGTH
    )


@pytest.fixture(scope="module")
def driver(rollout):
    from workers.rollout.async_engine import AsyncEngineDriver

    with AsyncEngineDriver(rollout.llm) as drv:
        yield drv


class Recorder:
    """The driver, with every call's engine input, parameters and output kept; `fail_next`
    makes the next call raise as an engine error would."""

    def __init__(self, driver):
        self.driver = driver
        self.calls: list[tuple[list[int], object, object]] = []
        self.fail_next = False

    async def generate(self, prompt_ids, params):
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("the engine broke")
        turn = await self.driver.generate(prompt_ids, params)
        self.calls.append((list(prompt_ids), params, turn))
        return turn

    def stats(self):
        return self.driver.stats()


def _settings(rollout, greedy: bool, **changes):
    from workers.rollout.base import sampling_settings

    return dataclasses.replace(sampling_settings(rollout.config, {} if not greedy else {"do_sample": False}), **changes)


@pytest.fixture
def make_endpoint(rollout, driver, tokenizer):
    from workers.rollout.openai_server import OpenAIEndpoint
    from workers.rollout.vllm_rollout import vllm_sampling_params

    endpoints = []

    def make(greedy=True, response_length=RESPONSE_LENGTH, **changes):
        recorder = Recorder(driver)
        endpoint = OpenAIEndpoint(
            recorder,
            tokenizer,
            rollout.eos_token_ids,
            _settings(rollout, greedy, **changes),
            rollout.max_model_len,
            response_length,
            make_params=vllm_sampling_params,
        )
        endpoint.start()
        endpoints.append(endpoint)
        return endpoint, recorder

    yield make
    for endpoint in endpoints:
        endpoint.close()
        endpoint.close()  # idempotent
    assert not rollout.llm.llm_engine.has_unfinished_requests()


def _client(endpoint):
    import openai

    return openai.AsyncOpenAI(base_url=endpoint.base_url, api_key="unused", max_retries=0)


def _decode(tokenizer, ids):
    return tokenizer.decode(list(ids), skip_special_tokens=True)


async def _agent(client, session_id: str, question: str):
    """Three model turns with a tool observation and a user message between them; the
    session id once as the header, then in the body. Returns the messages and responses."""
    messages = [{"role": "user", "content": question}]
    responses = []
    ways = [
        {"extra_headers": {"X-Session-Id": session_id}, "max_tokens": 6},
        {"extra_body": {"session_id": session_id}, "max_completion_tokens": 5},
        {"extra_headers": {"X-Session-Id": session_id}, "max_tokens": 7, "logprobs": True},
    ]
    observations = [
        {"role": "tool", "tool_call_id": "call_0", "content": "calculator: 5"},
        {"role": "user", "content": "Thanks. Now say the answer once more."},
    ]
    for i, way in enumerate(ways):
        # The request's temperature is not the trainer's: the endpoint ignores it.
        response = await client.chat.completions.create(
            model="anything", messages=messages, tools=TOOLS, temperature=0.0, top_p=0.5, **way
        )
        responses.append(response)
        messages.append({"role": "assistant", "content": response.choices[0].message.content})
        if i < len(observations):
            messages.append(observations[i])
    return messages, responses


def test_agents_sessions_hold_the_tokens_the_engine_saw_and_sampled(rollout, tokenizer, make_endpoint):
    from workers.rollout.multi_turn import ObservationRenderer, render_prompt_ids

    endpoint, recorder = make_endpoint(greedy=False)
    questions = {f"agent-{i}": f"What is {i} + {i + 2}? Use the calculator." for i in range(3)}

    async def run():
        client = _client(endpoint)
        return await asyncio.gather(*(_agent(client, sid, q) for sid, q in questions.items()))

    outcomes = dict(zip(questions, asyncio.run(run())))
    renderer = ObservationRenderer(tokenizer, True, rollout.eos_token_ids)
    eos = tokenizer.eos_token_id
    closings = 0
    for sid, (messages, responses) in outcomes.items():
        record = endpoint.take_session(sid)
        prompt = render_prompt_ids(tokenizer, messages[:1], TOOLS)
        calls = [c for c in recorder.calls if c[0][: len(prompt)] == prompt]
        assert len(calls) == 3 and record.turns == 3
        assert record.prompt_ids == prompt == calls[0][0]
        # The trajectory is the last engine input plus its output, token for token.
        assert record.prompt_ids + record.response_ids == calls[-1][0] + calls[-1][2].token_ids
        mask, log_probs = [], []
        for k, (fed, params, turn) in enumerate(calls):
            assert params.temperature == endpoint.settings.temperature == 1.0  # the trainer's, not 0.0
            assert params.max_tokens == [6, 5, 7][k]
            mask += [1] * len(turn.token_ids)
            log_probs += list(turn.log_probs)
            # (b) the assistant text is the decode of exactly the sampled ids
            assert responses[k].choices[0].message.content == _decode(tokenizer, turn.token_ids)
            assert responses[k].choices[0].finish_reason == turn.finish_reason
            if k + 1 < len(calls):
                after = fed + list(turn.token_ids)
                nxt = calls[k + 1][0]
                assert nxt[: len(after)] == after  # the engine was fed the recorded ids, not a re-render
                closing = [] if turn.token_ids[-1] in rollout.eos_token_ids else [eos]
                closings += len(closing)
                assert nxt[len(after) :] == closing + renderer.render([messages[2 * k + 2]])
                mask += [0] * (len(nxt) - len(after))
                log_probs += [0.0] * (len(nxt) - len(after))
        assert record.response_mask == mask
        assert record.log_probs == log_probs
        assert record.turn_ends == [i for i, m in enumerate(mask) if m and (i + 1 == len(mask) or not mask[i + 1])]
        assert record.finish_reason == calls[-1][2].finish_reason
        assert record.messages == [{"role": m["role"], "content": m["content"]} for m in messages]
        assert record.tools == TOOLS
        got = [c.logprob for c in responses[2].choices[0].logprobs.content]
        assert got == pytest.approx(list(calls[-1][2].log_probs), abs=1e-6)
    assert endpoint.session_ids() == []
    assert closings  # turns cut by max_tokens were closed with EOS (mask 0) before the next message


async def _post(endpoint, path, body=None, data=None, headers=None):
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{endpoint.base_url}{path}", json=body, data=data, headers=headers) as r:
            return r.status, await r.json()


def _assert_refused(outcome, status, *words):
    got_status, body = outcome
    assert got_status == status, body
    assert body["error"]["type"] == ("invalid_request_error" if status < 500 else "server_error")
    for word in words:
        assert word in body["error"]["message"], body


def test_bad_requests_get_openai_errors_and_the_server_goes_on(make_endpoint):
    endpoint, recorder = make_endpoint()
    chat, hi = "/chat/completions", [{"role": "user", "content": "hi"}]

    async def run():
        _assert_refused(await _post(endpoint, chat, data=b"{not json"), 400, "not valid JSON")
        _assert_refused(await _post(endpoint, chat, {"model": "m"}), 400, "messages")
        _assert_refused(await _post(endpoint, chat, {"messages": "hi"}), 400, "messages must be")
        _assert_refused(await _post(endpoint, chat, {"messages": [{"role": 3}]}), 400, "messages[0]")
        _assert_refused(await _post(endpoint, chat, {"messages": hi, "stream": True}), 400, "streaming")
        _assert_refused(await _post(endpoint, chat, {"messages": hi, "max_tokens": "4"}), 400, "max_tokens")
        _assert_refused(await _post(endpoint, chat, {"messages": hi, "n": 2}), 400, "n must be 1")
        _assert_refused(await _post(endpoint, "/completions", {"prompt": ["a", "b"]}), 400, "no batches")
        _assert_refused(await _post(endpoint, "/nowhere", {}), 404)
        recorder.fail_next = True
        _assert_refused(await _post(endpoint, chat, {"messages": hi, "max_tokens": 3}), 500, "the engine broke")

        # A session whose history is edited, shortened or started anew is refused and left as it was.
        head = {"X-Session-Id": "edit"}
        status, first = await _post(endpoint, chat, {"messages": hi, "max_tokens": 4}, headers=head)
        assert status == 200
        said = first["choices"][0]["message"]["content"]
        edited = hi + [{"role": "assistant", "content": said + "!"}, {"role": "user", "content": "go on"}]
        _assert_refused(await _post(endpoint, chat, {"messages": edited}, headers=head), 400, "messages[1]")
        _assert_refused(await _post(endpoint, chat, {"messages": hi}, headers=head), 400, "is missing")
        other = [{"role": "user", "content": "hello"}]
        _assert_refused(await _post(endpoint, chat, {"messages": other}, headers=head), 400, "messages[0]")
        ok = hi + [{"role": "assistant", "content": said}, {"role": "user", "content": "go on"}]
        both = await asyncio.gather(
            *(_post(endpoint, chat, {"messages": ok, "max_tokens": 40}, headers=head) for _ in range(2))
        )
        assert sorted(s for s, _ in both) == [200, 400]
        _assert_refused(max(both, key=lambda outcome: outcome[0] == 400), 400, "in flight")  # one at a time
        async with aiohttp.ClientSession() as http, http.get(f"{endpoint.base_url}/models") as r:
            return r.status, await r.json()

    status, models = asyncio.run(run())
    assert status == 200 and models["data"][0]["id"] == endpoint.model_name
    record = endpoint.take_session("edit")
    assert record.turns == 2 and len(recorder.calls) == 2  # the refused ones reached no engine


def test_requests_without_a_session_leave_no_record(tokenizer, make_endpoint):
    from workers.rollout.multi_turn import render_prompt_ids

    endpoint, recorder = make_endpoint()
    messages = [{"role": "user", "content": "Name a colour."}]

    async def run():
        client = _client(endpoint)
        first = await client.chat.completions.create(model="m", messages=messages, max_tokens=6)
        again = await client.chat.completions.create(model="m", messages=messages, max_tokens=6)
        history = messages + [{"role": "assistant", "content": first.choices[0].message.content}]
        follow = history + [{"role": "user", "content": "Another one."}]
        await client.chat.completions.create(model="m", messages=follow, max_tokens=6)
        return first, again, follow

    first, again, follow = asyncio.run(run())
    assert first.choices[0].message.content == again.choices[0].message.content
    assert endpoint.session_ids() == []
    # Stateless: every request is its conversation rendered whole.
    assert recorder.calls[0][0] == recorder.calls[1][0] == render_prompt_ids(tokenizer, messages)
    assert recorder.calls[2][0] == render_prompt_ids(tokenizer, follow)


def test_the_response_budget_ends_a_session_with_length(make_endpoint):
    import openai

    endpoint, recorder = make_endpoint(response_length=20, ignore_eos=True)
    observation = {"role": "tool", "content": "the tool printed a long line of output " * 2}

    async def run():
        client = _client(endpoint)
        messages = [{"role": "user", "content": "Go."}]
        head = {"X-Session-Id": "tight"}
        first = await client.chat.completions.create(model="m", messages=messages, max_tokens=12, extra_headers=head)
        messages += [{"role": "assistant", "content": first.choices[0].message.content}, observation]
        with pytest.raises(openai.BadRequestError, match="no room left") as refused:
            await client.chat.completions.create(model="m", messages=messages, extra_headers=head)
        assert refused.value.body["code"] == "context_length_exceeded"
        with pytest.raises(openai.BadRequestError, match="is finished"):
            await client.chat.completions.create(model="m", messages=messages, extra_headers=head)
        # Without max_tokens the turn takes the room left, here all of response_length.
        whole = await client.chat.completions.create(model="m", messages=messages[:1], extra_body={"session_id": "w"})
        assert whole.choices[0].finish_reason == "length"
        return first

    first = asyncio.run(run())
    record = endpoint.take_session("tight")
    assert record.finished and record.finish_reason == "length"
    assert record.turns == 1 and record.response_mask == [1] * 12  # the observation that did not fit is dropped
    assert record.response_ids == recorder.calls[0][2].token_ids and first.choices[0].finish_reason == "length"
    assert len(endpoint.take_session("w").response_ids) == 20


def test_a_greedy_turn_through_the_endpoint_equals_generate_ids(rollout, driver, tokenizer, make_endpoint):
    from workers.rollout.multi_turn import render_prompt_ids

    endpoint, _ = make_endpoint()
    prompt = [1000 + 37 * i for i in range(20)]
    messages = [{"role": "user", "content": "What is the capital of France?"}]

    async def run():
        client = _client(endpoint)
        completion = await client.completions.create(
            model="m", prompt=prompt, max_tokens=24, extra_body={"session_id": "c", "return_token_ids": True}
        )
        chat = await client.chat.completions.create(
            model="m", messages=messages, max_tokens=24, extra_body={"return_token_ids": True}
        )
        return completion, chat

    async def with_stop(stop):
        return await _client(endpoint).completions.create(
            model="m", prompt=prompt, max_tokens=24, stop=[stop], extra_body={"return_token_ids": True}
        )

    completion, chat = asyncio.run(run())
    chat_prompt = render_prompt_ids(tokenizer, messages)
    with driver.pause():
        expected = rollout.generate_ids([prompt, chat_prompt], _settings(rollout, greedy=True), [24, 24])
    # A stop string from the request ends the turn early; the text keeps what was sampled.
    stop = _decode(tokenizer, expected[0].token_ids[8:10]).strip()
    stopped = asyncio.run(with_stop(stop)).choices[0]
    assert stopped.finish_reason == "stop" and stop in stopped.text
    assert stopped.token_ids == expected[0].token_ids[: len(stopped.token_ids)] and len(stopped.token_ids) <= 10
    record = endpoint.take_session("c")
    assert record.prompt_ids == prompt and record.response_ids == expected[0].token_ids
    assert completion.choices[0].token_ids == expected[0].token_ids
    assert completion.choices[0].text == _decode(tokenizer, expected[0].token_ids)
    assert chat.prompt_token_ids == chat_prompt and chat.choices[0].token_ids == expected[1].token_ids
    assert len(set(expected[0].token_ids)) > 8  # the model's output depends on its input: the check has teeth


async def _until(condition, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.005)


def test_a_client_that_leaves_or_a_taken_session_aborts_the_engine_request(rollout, driver, make_endpoint):
    engine = rollout.llm.llm_engine
    endpoint, _ = make_endpoint(ignore_eos=True)
    long = {"messages": [{"role": "user", "content": "Tell a long story."}], "max_tokens": 180}

    async def run():
        driver.reset_stats()
        client_side = asyncio.create_task(_post(endpoint, "/chat/completions", long, headers={"X-Session-Id": "gone"}))
        await _until(lambda: driver.stats().steps >= 3)
        client_side.cancel()  # the connection closes; the server cancels the handler
        await _until(lambda: not engine.has_unfinished_requests() and endpoint.session_ids() == [])
        assert driver.stats().finished == 0 and driver.stats().steps < 180

        # The trainer takes a session mid-turn: the turn is aborted and the agent told.
        status, body = await _post(
            endpoint, "/chat/completions", {**long, "max_tokens": 3}, headers={"X-Session-Id": "t"}
        )
        assert status == 200
        said = body["choices"][0]["message"]["content"]
        more = long["messages"] + [{"role": "assistant", "content": said}, {"role": "user", "content": "More."}]
        driver.reset_stats()
        turn = asyncio.create_task(
            _post(endpoint, "/chat/completions", {**long, "messages": more}, headers={"X-Session-Id": "t"})
        )
        await _until(lambda: driver.stats().steps >= 3)
        record = await asyncio.to_thread(endpoint.take_session, "t")
        _assert_refused(await turn, 400, "taken by the trainer")
        await _until(lambda: not engine.has_unfinished_requests())
        _assert_refused(await _post(endpoint, "/chat/completions", long, headers={"X-Session-Id": "t"}), 400, "taken")
        return record

    record = asyncio.run(run())
    assert record.turns == 1 and record.response_mask == [1] * 3
