"""Environments without an engine: the registry (names, files, skyrl-gym), the row ->
extras mapping, arithmetic_retry, the step-output check, the time-limited step pool,
verl tools (hermes parsing, truncation, time limit, the Python tool) and verl
interactions through the environment contract."""

from __future__ import annotations

import asyncio
import gc
import textwrap
import threading
import time
import weakref
from types import SimpleNamespace

import numpy as np
import pytest

from reward.environments import (
    ENV_REGISTRY,
    BaseTextEnv,
    EnvFactory,
    EnvTimeout,
    check_step_output,
    env_extras,
    get_env_cls,
    register_env,
)
from reward.environments.arithmetic_retry import RETRY_MESSAGE, ArithmeticRetryEnv
from reward.environments.pool import StepPool
from reward.environments.python_tool import run_python
from reward.environments.tools import ToolEnv, load_tools, parse_tool_calls, truncate

ROW = {
    "data_source": "arithmetic",
    "reward_model": {"style": "rule", "ground_truth": "68"},
    "extra_info": {"index": 3, "question": "What is 23 + 45?"},
    "index": 3,
}


def multi_turn(**overrides):
    """The fields of MultiTurnConfig the environments read, with the yaml's defaults."""
    values = dict(
        enable=True,
        max_assistant_turns=None,
        max_user_turns=None,
        max_tokens_per_turn=None,
        interaction_config_path=None,
        tool_config_path=None,
        max_tool_response_length=256,
        tool_response_truncate_side="middle",
        format="hermes",
        env_class=None,
        env_kwargs={},
        use_conversation_multi_turn=True,
        reward_placement="final",
        env_workers=4,
        env_step_timeout_s=30.0,
        tolerate_env_errors=False,
        max_parallel_calls=None,
    )
    values.update(overrides)
    return SimpleNamespace(**values)


# ---------------------------------------------------------------- registry


def test_register_and_look_up_by_name():
    @register_env("unit_test_echo")
    class Echo(BaseTextEnv):
        def step(self, action):
            return {"observations": [], "reward": 0.0, "done": True, "metadata": {}}

    assert get_env_cls("unit_test_echo") is Echo and ENV_REGISTRY["unit_test_echo"] is Echo
    register_env("unit_test_echo")(Echo)  # the same class again is fine
    with pytest.raises(ValueError, match="already registered"):
        register_env("unit_test_echo")(type("Other", (BaseTextEnv,), {}))
    with pytest.raises(ValueError, match=r"unknown environment 'no_such_env'; known: .*arithmetic_retry"):
        get_env_cls("no_such_env")


def test_user_environment_from_a_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_env.py").write_text(
        textwrap.dedent("""
        class Guess:
            def __init__(self, env_config=None, extras=None):
                self.extras = extras
            def init(self, prompt):
                return prompt, {}
            def step(self, action):
                return {"observations": [], "reward": 1.0, "done": True, "metadata": {}}
        def helper():
            pass
    """)
    )
    cls = get_env_cls("my_env.py:Guess")
    assert cls.__name__ == "Guess" and cls(extras={"a": 1}).step("x")["reward"] == 1.0
    with pytest.raises(AttributeError, match=r"'Gues' not found in .*my_env.py; classes defined there: \['Guess'\]"):
        get_env_cls("my_env.py:Gues")
    with pytest.raises(FileNotFoundError, match=r"'nope.py' not found \(resolved to .*nope.py, working directory"):
        get_env_cls("nope.py:Guess")


def test_extras_map_verl_rows_onto_what_skyrl_gym_reads():
    row = {**ROW, "raw_prompt": [{"role": "user", "content": "q"}], "tags": np.array([1, 2])}
    extras = env_extras(row, max_turns=4)
    assert extras["reward_spec"] == ROW["reward_model"] and extras["reward_model"] == ROW["reward_model"]
    assert extras["max_turns"] == 4 and extras["tags"] == [1, 2] and "raw_prompt" not in extras
    assert env_extras({**ROW, "max_turns": 2}, max_turns=4)["max_turns"] == 2  # the row's own wins
    assert "max_turns" not in env_extras(ROW, max_turns=None)


def test_factory_picks_the_run_or_the_row_environment_and_its_kwargs():
    factory = EnvFactory(multi_turn(env_kwargs={"max_attempts": 2, "gsm8k": {"x": 1}}))
    env = factory.make({**ROW, "env_class": "arithmetic_retry"})
    assert isinstance(env, ArithmeticRetryEnv) and env.max_attempts == 2
    assert "gsm8k" not in env.env_config  # another environment's own section
    assert EnvFactory(multi_turn(env_class="arithmetic_retry")).make({**ROW, "env_class": "gsm8k"}).max_attempts == 3
    with pytest.raises(
        ValueError, match="no environment for this row: set actor_rollout_ref.rollout.multi_turn.env_class"
    ):
        EnvFactory(multi_turn()).make(ROW)
    with pytest.raises(ValueError, match="unknown environment 'typo'"):
        EnvFactory(multi_turn(env_class="typo"))


# ---------------------------------------------------------------- arithmetic_retry


def test_arithmetic_retry_gives_retries_then_ends():
    env = ArithmeticRetryEnv(extras={**ROW, "max_turns": 3})
    assert env.init([{"role": "user", "content": "q"}])[0] == [{"role": "user", "content": "q"}]
    first = env.step("23 + 45 = 58")
    assert first == {
        "observations": [{"role": "user", "content": RETRY_MESSAGE}],
        "reward": 0.0,
        "done": False,
        "metadata": {},
    }
    assert env.step("68")["reward"] == 1.0 and env.turns == 2
    assert env.get_metrics() == {"attempts": 2, "solved": 1.0, "first_attempt_correct": 0.0}

    stubborn = ArithmeticRetryEnv(extras=ROW, env_config={"max_attempts": 2})
    assert not stubborn.step("1")["done"]
    last = stubborn.step("2")
    assert last["done"] and last["reward"] == 0.0 and last["observations"] == []


def test_step_output_is_checked():
    assert check_step_output({"observations": None, "reward": 1, "done": True}) == ([], 1.0, True, {})
    for bad, match in [
        ("text", "not a dict"),
        ({"observations": [], "reward": 0.0}, r"without \['done'\]"),
        ({"observations": ["hi"], "reward": 0.0, "done": False}, "not a chat message"),
        ({"observations": [], "reward": "high", "done": False}, "must be a number"),
        ({"observations": [], "reward": float("nan"), "done": False}, "finite"),
        ({"observations": [], "reward": 0.0, "done": "yes"}, "must be a bool"),
    ]:
        with pytest.raises(ValueError, match=match):
            check_step_output(bad)


# ---------------------------------------------------------------- the step pool


def test_step_pool_cuts_off_a_sleeping_call_and_keeps_its_capacity():
    pool = StepPool(workers=2, timeout_s=0.3)
    start = time.monotonic()

    def boom():
        raise KeyError("x")

    outcomes = pool.run([lambda: time.sleep(60), lambda: 7, boom])
    assert time.monotonic() - start < 3
    assert outcomes[0].timed_out and outcomes[1].value == 7 and isinstance(outcomes[2].error, KeyError)
    # The stuck thread was replaced: two more calls still run side by side.
    start = time.monotonic()
    assert [o.value for o in pool.run([lambda: time.sleep(0.2) or 1, lambda: time.sleep(0.2) or 2])] == [1, 2]
    assert time.monotonic() - start < 0.39
    pool.shutdown()


def test_step_pool_times_a_call_from_its_start_not_its_queueing():
    pool = StepPool(workers=1, timeout_s=0.5)
    outcomes = pool.run([lambda: time.sleep(0.3) or "a", lambda: time.sleep(0.3) or "b"])
    assert [o.value for o in outcomes] == ["a", "b"] and not any(o.timed_out for o in outcomes)


def test_an_abandoned_awaited_call_ending_after_its_event_loop_closed_raises_nothing(monkeypatch):
    # The agent loop's event loop may end while a timed-out environment step is still running;
    # the step's thread must not then notify the closed loop (RuntimeError in a pool thread).
    import threading

    errors = []
    monkeypatch.setattr(threading, "excepthook", lambda args: errors.append(args.exc_value))
    pool = StepPool(workers=1, timeout_s=0.1)
    done = threading.Event()
    outcome = asyncio.run(pool.call(lambda: time.sleep(0.4) or done.set()))
    assert outcome.timed_out
    assert done.wait(5)
    time.sleep(0.1)  # the thread's notify runs after fn returns
    assert errors == []
    # finished calls on a live loop are still awaited normally
    assert asyncio.run(pool.call(lambda: 5)).value == 5
    pool.shutdown()


def _pool_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("env-worker-") and t.is_alive()}


def _still_alive(threads: set[threading.Thread]) -> int:
    """How many of `threads` are alive after waiting up to 5 s for them to end. Only these
    are counted: other modules' pools may end theirs meanwhile (the collection below)."""
    deadline = time.monotonic() + 5
    while any(t.is_alive() for t in threads) and time.monotonic() < deadline:
        time.sleep(0.01)
    return sum(t.is_alive() for t in threads)


def test_a_step_pool_nobody_holds_ends_its_threads_as_shutdown_does():
    # A rollout loop's pool used to keep its threads (blocked on the queue) after the loop and
    # its engine were gone: ~250 threads in the suite's process by the end of a run.
    before = _pool_threads()
    pool = StepPool(workers=3, timeout_s=1.0)
    threads = _pool_threads() - before
    assert len(threads) == 3
    assert [o.value for o in pool.run([lambda: 1, lambda: 2])] == [1, 2]
    del pool
    gc.collect()
    assert _still_alive(threads) == 0
    kept = StepPool(workers=2, timeout_s=1.0)
    threads = _pool_threads() - before
    assert len(threads) == 2
    kept.shutdown()
    kept.shutdown()  # a second shutdown (or the collection after it) ends nothing more
    assert _still_alive(threads) == 0


class _PoolOwner:
    """workers/rollout/multi_turn.MultiTurnLoop's shape: it holds the pool, and each call it
    hands the pool (there a closure over the loop) holds it."""

    def __init__(self):
        self.pool = StepPool(workers=2, timeout_s=1.0)

    def step(self):
        return self


def test_a_dropped_owner_whose_calls_hold_it_ends_its_pools_threads():
    # An idle thread used to keep its last call in its frame (a root the collector never
    # clears): call -> owner -> pool stayed alive, and so did the threads (137 left by
    # tests/integration/test_multi_turn.py at the end of its module).
    before = _pool_threads()
    owner = _PoolOwner()
    threads = _pool_threads() - before
    assert len(threads) == 2
    assert all(o.value is owner for o in owner.pool.run([owner.step, owner.step]))
    assert asyncio.run(owner.pool.call(owner.step)).value is owner  # the agent loop's way
    gone = weakref.ref(owner)
    del owner
    gc.collect()
    assert gone() is None
    assert _still_alive(threads) == 0


# ---------------------------------------------------------------- tools


def test_hermes_tool_calls_are_parsed_in_order_with_their_errors():
    text = (
        'Let me compute. <tool_call>{"name": "python", "arguments": {"code": "1+1"}}</tool_call> and '
        '<tool_call>\n{"name": "python", "arguments": "{\\"code\\": \\"2\\"}"}\n</tool_call>'
        "<tool_call>{not json}</tool_call><tool_call>[1]</tool_call>"
    )
    calls = parse_tool_calls(text)
    assert [(c.name, c.arguments) for c in calls[:2]] == [("python", {"code": "1+1"}), ("python", {"code": "2"})]
    assert "not valid JSON" in calls[2].error and '{"name"' in calls[3].error
    assert parse_tool_calls("no calls here") == []


def test_truncation_follows_verl():
    assert truncate("abcdefgh", 4, "left") == "abcd...(truncated)"
    assert truncate("abcdefgh", 4, "right") == "(truncated)...efgh"
    assert truncate("abcdefgh", 4, "middle") == "ab...(truncated)...gh"
    assert truncate("abc", 4, "middle") == "abc"


def test_python_tool_computes_is_time_limited_and_has_no_network():
    assert run_python("23 * 45") == "1035"
    assert run_python("x = 2\nprint(x ** 10)") == "1024"
    assert run_python("1/0").endswith("Error: ZeroDivisionError: division by zero")
    start = time.monotonic()
    assert run_python("while True: pass", timeout_s=0.5) == "Error: timed out after 0.5 s"
    assert time.monotonic() - start < 3
    out = run_python("import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=1)")
    assert out.startswith("Error: OSError") and "network" in out


TOOLS_MODULE = """
import asyncio, time

class Adder:
    def __init__(self, config, tool_schema):
        self.config, self.tool_schema, self.created, self.released = config, tool_schema, {}, []
    async def create(self, instance_id=None, offset=0, **kwargs):
        self.created[instance_id] = offset
        return instance_id, {"text": "ready"}
    async def execute(self, instance_id, parameters, **kwargs):
        return {"text": str(parameters["a"] + parameters["b"] + self.created[instance_id])}, 0.5, {}
    async def release(self, instance_id, **kwargs):
        self.released.append(instance_id)

class Sleeper:
    def __init__(self, config, tool_schema):
        pass
    def execute(self, instance_id, parameters):
        time.sleep(60)
"""

TOOLS_YAML = """
tools:
  - class_name: unit_tools_mod.Adder
    config: {}
    tool_schema:
      type: function
      function: {name: add, description: adds, parameters: {type: object, properties: {}}}
  - class_name: unit_tools_mod.Sleeper
    config: {timeout_s: 0.3}
    tool_schema: {type: function, function: {name: sleep, description: sleeps, parameters: {}}}
  - class_name: reward.environments.python_tool.PythonTool
    config: {timeout_s: 5}
"""


@pytest.fixture
def tool_config(tmp_path, monkeypatch):
    (tmp_path / "unit_tools_mod.py").write_text(TOOLS_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "tools.yaml"
    path.write_text(TOOLS_YAML)
    return str(path)


def test_tool_env_answers_calls_and_cuts_off_a_hanging_tool(tool_config):
    tools = load_tools(tool_config)
    assert sorted(tools) == ["add", "python", "sleep"]
    row = {**ROW, "extra_info": {"tools_kwargs": {"add": {"create_kwargs": {"offset": 100}}}}}
    env = ToolEnv(tools, None, row, max_response_chars=64, truncate_side="middle", tool_role=False)
    env.init([{"role": "user", "content": "q"}])
    out = env.step(
        '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
        '<tool_call>{"name": "nope", "arguments": {}}</tool_call>'
        '<tool_call>{"name": "python", "arguments": {"code": "6 * 7"}}</tool_call>'
        '<tool_call>{"name": "python", "arguments": {"code": "print(\'x\' * 100)"}}</tool_call>'
    )
    assert out["reward"] == 0.5 and out["done"] is False
    assert out["observations"] == [
        {
            "role": "user",
            "content": "\n".join(
                [
                    "<tool_response>\n103\n</tool_response>",
                    "<tool_response>\nError: unknown tool 'nope'; tools: add, python, sleep\n</tool_response>",
                    "<tool_response>\n42\n</tool_response>",
                    f"<tool_response>\n{'x' * 32}...(truncated)...{'x' * 32}\n</tool_response>",
                ]
            ),
        }
    ]
    assert env.get_metrics() == {"tool_calls": 4, "tool_errors": 1, "tool_timeouts": 0}
    start = time.monotonic()
    with pytest.raises(EnvTimeout, match=r"tool sleep gave no answer within its timeout_s=0.3 \(\+2 s grace\)"):
        env.step('<tool_call>{"name": "sleep", "arguments": {}}</tool_call>')
    assert time.monotonic() - start < 5 and env.get_metrics()["tool_timeouts"] == 1
    assert env.step("The answer is 3.") == {"observations": [], "reward": 0.0, "done": True, "metadata": {}}
    env.close()
    assert len(tools["add"].instance.released) == 1


def test_max_parallel_calls_runs_the_first_calls_of_a_turn_only(tool_config):
    # verl's multi_turn.max_parallel_calls (tool_agent_loop.py: tool_calls[: max_parallel_calls])
    factory = EnvFactory(multi_turn(tool_config_path=tool_config, max_parallel_calls=1), tool_role=True)
    env = factory.make(ROW)
    env.init([{"role": "user", "content": "q"}])
    out = env.step(
        '<tool_call>{"name": "python", "arguments": {"code": "6 * 7"}}</tool_call>'
        '<tool_call>{"name": "python", "arguments": {"code": "1 + 1"}}</tool_call>'
    )
    assert out["observations"] == [{"role": "tool", "content": "42"}]
    assert env.get_metrics()["tool_calls"] == 1


def test_tool_env_hands_turns_without_calls_to_the_inner_environment(tool_config):
    factory = EnvFactory(multi_turn(tool_config_path=tool_config, env_class="arithmetic_retry"), tool_role=True)
    env = factory.make(ROW)
    env.init([{"role": "user", "content": "q"}])
    tool_turn = env.step('<tool_call>{"name": "python", "arguments": {"code": "23 + 45"}}</tool_call>')
    assert tool_turn["observations"] == [{"role": "tool", "content": "68"}]
    assert env.step("68")["reward"] == 1.0
    assert env.get_metrics()["solved"] == 1.0
    assert factory.tool_schemas[2]["function"]["name"] == "python"


# ---------------------------------------------------------------- interactions

INTERACTION_MODULE = """
class RetryInteraction:
    def __init__(self, config):
        self.config, self.state, self.finalized = config, {}, []
    async def start_interaction(self, instance_id=None, ground_truth=None, **kwargs):
        self.state[instance_id] = ground_truth
    async def generate_response(self, instance_id, messages, **kwargs):
        correct = messages[-1]["content"].strip() == self.state[instance_id]
        return correct, "Right." if correct else "Wrong, try again.", float(correct), {}
    async def finalize_interaction(self, instance_id, **kwargs):
        self.finalized.append(instance_id)
"""


def test_verl_interaction_runs_as_an_environment(tmp_path, monkeypatch):
    (tmp_path / "unit_interaction_mod.py").write_text(INTERACTION_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "interaction.yaml"
    path.write_text("interaction:\n  - class_name: unit_interaction_mod.RetryInteraction\n    config: {retries: 2}\n")
    factory = EnvFactory(multi_turn(interaction_config_path=str(path)))
    interaction = factory.interactions["retry"]
    assert interaction.config == {"retries": 2, "name": "retry"}
    row = {**ROW, "extra_info": {"interaction_kwargs": {"name": "retry", "ground_truth": "68"}}}
    env = factory.make(row)
    env.init([{"role": "user", "content": "What is 23 + 45?"}])
    assert env.step("58") == {
        "observations": [{"role": "user", "content": "Wrong, try again."}],
        "reward": 0.0,
        "done": False,
        "metadata": {},
    }
    assert env.step("68") == {"observations": [], "reward": 1.0, "done": True, "metadata": {}}
    assert [m["role"] for m in env.messages] == ["user", "assistant", "user", "assistant"]
    env.close()
    assert interaction.finalized == [env.instance_id]
    with pytest.raises(ValueError, match=r"interaction_kwargs.name is 'other'; configured interactions: \['retry'\]"):
        factory.make({**ROW, "extra_info": {"interaction_kwargs": {"name": "other"}}})


# ---------------------------------------------------------------- skyrl-gym


def test_skyrl_gym_environments_plug_in_by_name_with_verl_rows():
    pytest.importorskip("skyrl_gym", reason="skyrl-gym is not installed (pip install 'hybrid[env]')")
    factory = EnvFactory(multi_turn(max_assistant_turns=2))
    gsm8k = factory.make({**ROW, "env_class": "gsm8k_multi_turn"})
    assert type(gsm8k).__module__.startswith("skyrl_gym") and gsm8k.max_turns == 2
    assert gsm8k.step("#### 68")["reward"] == 1.0
    aime = factory.make({**ROW, "env_class": "aime"})  # reads reward_model, not reward_spec
    assert aime.ground_truth == "68"
