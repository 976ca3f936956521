"""The multi-turn loop (workers/rollout/multi_turn.py).

Most tests drive it with a scripted engine (it answers each turn with token ids the test
chooses, so the expected sequence is known) and scripted environments; the engine-facing
ones use the real in-process vLLM engine and the HF engine on the tiny random model.
Shown: observation spans have mask 0 and decode to the rendered observation; the
token-in-token-out sequence equals the chat template of the whole conversation on two
templates, and keeps non-canonical sampled ids exactly; per-turn rewards land on each
turn's last model token; max_assistant_turns stops a never-ending environment exactly;
an overflowing trajectory stays within the budget and never sends an over-long prompt; a
sleeping environment or tool is cut off and counted; a raising environment stops the run
with its class, row and message (or is counted); skyrl-gym's gsm8k_multi_turn runs
unchanged.
"""

from __future__ import annotations

import copy
import dataclasses
import time

import pytest
import torch

from reward.environments import BaseTextEnv, register_env
from reward.environments.arithmetic_retry import RETRY_MESSAGE
from tests.integration.engine_helpers import chat_batch, engine_config
from workers.rollout.base import GeneratedTurn, engine_max_model_len
from workers.rollout.multi_turn import MultiTurnLoop

pytestmark = pytest.mark.integration

MT = "actor_rollout_ref.rollout.multi_turn"
QUESTION = "What is 23 + 45? Reply with only the number."
CHAT = [{"role": "user", "content": QUESTION}]
# A second template: no default system prompt, roles as plain text, turns closed by EOS.
PLAIN_ROLES_TEMPLATE = (
    "{% for m in messages %}{{ '<|' + m['role'] + '|>\n' + m['content'] + eos_token + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)


# ---------------------------------------------------------------- scripted environments


@register_env("test_scripted")
class ScriptedEnv(BaseTextEnv):
    """env_kwargs.mode: "retry" (wrong until the answer 68, rewards 0.25 then 1),
    "forever" (never done, reward = turn number), "sleep" (row index 1 sleeps in step),
    "raise" (row index 1 raises in step), "malformed" (row index 1 returns a string reward)."""

    def step(self, action):
        self.turns += 1
        mode, row = self.env_config.mode, self.extras.get("index")
        if mode == "sleep" and row == 1:
            time.sleep(60)
        if mode == "raise" and row == 1:
            raise ArithmeticError(f"cannot judge {action!r}")
        if mode == "malformed" and row == 1:
            return {"observations": [], "reward": "high", "done": True}
        if mode == "forever":
            observations = [{"role": "user", "content": f"Go on ({self.turns})."}]
            return {"observations": observations, "reward": float(self.turns), "done": False, "metadata": {}}
        correct = action.strip() == "68"
        observations = [] if correct else [{"role": "user", "content": RETRY_MESSAGE}]
        return {"observations": observations, "reward": 1.0 if correct else 0.25, "done": correct, "metadata": {}}

    def get_metrics(self):
        return {"steps": self.turns}


# ---------------------------------------------------------------- a scripted engine


class ScriptedEngine:
    """The engine side of the loop's contract, answering turn k of every trajectory with
    `script[k]` (token ids), cut at the budget; it records every request."""

    def __init__(self, config, tokenizer, script, eos_token_id=None):
        self.config, self.tokenizer, self.script = config, tokenizer, script
        self.eos_token_ids = {tokenizer.eos_token_id if eos_token_id is None else eos_token_id}
        self.pad_token_id = tokenizer.pad_token_id
        self.max_model_len = engine_max_model_len(config)
        self.requests: list[tuple[int, int]] = []  # (prompt length, max_tokens)
        self.calls = 0
        self.loop = None

    def generate_ids(self, prompt_ids, settings, max_tokens):
        assert settings.n == 1
        turn = self.script[min(self.calls, len(self.script) - 1)]
        self.calls += 1
        out = []
        for ids, budget in zip(prompt_ids, max_tokens):
            self.requests.append((len(ids), budget))
            sampled = list(turn)[:budget]
            out.append(
                GeneratedTurn(sampled, [-0.5] * len(sampled), "stop" if sampled[-1] in self.eos_token_ids else "length")
            )
        return out

    def generate_sequences(self, prompts):
        self.loop = MultiTurnLoop.for_engine(self, self.loop)
        return self.loop.generate_sequences(prompts)


def rollout_config(model_dir, *overrides, n=1, response_length=64):
    cfg = engine_config(model_dir, f"{MT}.enable=true", *overrides, n=n, response_length=response_length)
    return cfg.actor_rollout_ref.rollout


def encode(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def spans(mask_row):
    """[(value, start, end)] runs of a 0/1 list."""
    runs, start = [], 0
    for i in range(1, len(mask_row) + 1):
        if i == len(mask_row) or mask_row[i] != mask_row[start]:
            runs.append((mask_row[start], start, i))
            start = i
    return runs


def real_tokens(out, i):
    """Prompt (without left padding) + response (without right padding) of sample i."""
    mask = out.batch["attention_mask"][i].bool()
    return out.batch["input_ids"][i][mask].tolist()


# ---------------------------------------------------------------- token in, token out


@pytest.mark.parametrize("template", ["smollm2", "plain_roles"])
def test_sequence_is_the_chat_template_of_the_whole_conversation(tiny_model_dir, tokenizer, template):
    tok = copy.deepcopy(tokenizer)
    if template == "plain_roles":
        tok.chat_template = PLAIN_ROLES_TEMPLATE
    eos = tok.eos_token_id
    script = [encode(tok, "58") + [eos], encode(tok, "The answer is 68") + [eos], encode(tok, "68") + [eos]]
    config = rollout_config(tiny_model_dir, f"{MT}.env_class=test_scripted", f"{MT}.env_kwargs.mode=retry")
    out = ScriptedEngine(config, tok, script).generate_sequences(chat_batch(tok, [CHAT]))
    conversation = CHAT + [
        {"role": "assistant", "content": "58"},
        {"role": "user", "content": RETRY_MESSAGE},
        {"role": "assistant", "content": "The answer is 68"},
        {"role": "user", "content": RETRY_MESSAGE},
        {"role": "assistant", "content": "68"},
    ]
    expected = encode(tok, tok.apply_chat_template(conversation, tokenize=False))
    ours = real_tokens(out, 0)
    assert ours == expected[: len(ours)] and tok.decode(expected[len(ours) :]) == "\n"

    width = out.batch["prompts"].shape[1]
    length = int(out.batch["attention_mask"][0, width:].sum())
    mask, responses = out.batch["response_mask"][0, :length].tolist(), out.batch["responses"][0].tolist()
    assert [responses[a:b] for value, a, b in spans(mask) if value == 1] == script
    smollm2 = template == "smollm2"
    user, assistant = (
        ("<|im_start|>user\n", "<|im_start|>assistant\n") if smollm2 else ("<|user|>\n", "<|assistant|>\n")
    )
    expected_obs = f"\n{user}{RETRY_MESSAGE}{tok.eos_token}\n{assistant}"
    # Mask 0 exactly on the rendered observation (the newline after the model's EOS
    # included), with no default system prompt injected.
    assert [tok.decode(responses[a:b]) for value, a, b in spans(mask) if value == 0] == [expected_obs] * 2
    assert out.non_tensor_batch["multi_turn_turns"].tolist() == [3]
    assert out.non_tensor_batch["multi_turn_finish_reason"].tolist() == ["done"]


def test_non_canonical_sampled_ids_are_kept_exactly(tiny_model_dir, tokenizer):
    eos = tokenizer.eos_token_id
    canonical = encode(tokenizer, "hello")
    split = encode(tokenizer, "hel") + encode(tokenizer, "lo")
    assert split != canonical and encode(tokenizer, tokenizer.decode(split)) == canonical
    script = [split + [eos], encode(tokenizer, "68") + [eos]]
    config = rollout_config(tiny_model_dir, f"{MT}.env_class=test_scripted", f"{MT}.env_kwargs.mode=retry")
    engine = ScriptedEngine(config, tokenizer, script)
    out = engine.generate_sequences(chat_batch(tokenizer, [CHAT]))
    response = out.batch["responses"][0].tolist()
    assert response[: len(split) + 1] == split + [eos]
    # The second turn was prompted with exactly the sampled ids too.
    assert engine.requests[1][0] == int(out.batch["attention_mask"][0].sum()) - len(script[1])


def test_observation_spans_are_masked_and_decode_to_the_rendered_observation(tiny_model_dir, tokenizer):
    eos = tokenizer.eos_token_id
    config = rollout_config(
        tiny_model_dir,
        f"{MT}.env_class=test_scripted",
        f"{MT}.env_kwargs.mode=forever",
        f"{MT}.max_assistant_turns=3",
    )
    out = ScriptedEngine(config, tokenizer, [encode(tokenizer, "Hmm") + [eos]]).generate_sequences(
        chat_batch(tokenizer, [CHAT])
    )
    mask, responses = out.batch["response_mask"][0].tolist(), out.batch["responses"][0].tolist()
    log_probs = out.batch["rollout_log_probs"][0].tolist()
    length = int(out.batch["attention_mask"][0, out.batch["prompts"].shape[1] :].sum())
    runs = spans(mask[:length])
    assert [v for v, _, _ in runs] == [1, 0, 1, 0, 1]
    for k, (_, a, b) in enumerate(r for r in runs if r[0] == 0):
        expected = f"\n<|im_start|>user\nGo on ({k + 1}).<|im_end|>\n<|im_start|>assistant\n"
        assert tokenizer.decode(responses[a:b]) == expected
        assert all(p == 0.0 for p in log_probs[a:b])
    assert all(p == -0.5 for v, a, b in runs if v == 1 for p in log_probs[a:b])
    assert out.batch["attention_mask"][0, out.batch["prompts"].shape[1] :].tolist() == [1] * length + [0] * (
        64 - length
    )


def test_plain_text_observations_when_not_a_conversation(tiny_model_dir, tokenizer):
    config = rollout_config(
        tiny_model_dir,
        f"{MT}.env_class=test_scripted",
        f"{MT}.env_kwargs.mode=forever",
        f"{MT}.max_assistant_turns=2",
        f"{MT}.use_conversation_multi_turn=false",
    )
    turn = encode(tokenizer, " Hmm")
    out = ScriptedEngine(config, tokenizer, [turn]).generate_sequences(chat_batch(tokenizer, [CHAT]))
    expected = turn + encode(tokenizer, "Go on (1).") + turn
    assert out.batch["responses"][0, : len(expected)].tolist() == expected
    observation = len(expected) - 2 * len(turn)
    assert out.batch["response_mask"][0, : len(expected)].tolist() == [1] * len(turn) + [0] * observation + [1] * len(
        turn
    )


# ---------------------------------------------------------------- rewards, turns, budgets


@pytest.mark.parametrize("placement", ["turn", "final"])
def test_rewards_land_on_each_turns_last_model_token(tiny_model_dir, tokenizer, placement):
    eos = tokenizer.eos_token_id
    script = [encode(tokenizer, "58") + [eos], encode(tokenizer, "68") + [eos]]
    config = rollout_config(
        tiny_model_dir,
        f"{MT}.env_class=test_scripted",
        f"{MT}.env_kwargs.mode=retry",
        f"{MT}.reward_placement={placement}",
    )
    out = ScriptedEngine(config, tokenizer, script).generate_sequences(chat_batch(tokenizer, [CHAT]))
    mask, rewards = out.batch["response_mask"][0].tolist(), out.batch["env_rewards"][0]
    ends = [b - 1 for v, a, b in spans(mask) if v == 1]
    assert len(ends) == 2
    expected = torch.zeros_like(rewards)
    if placement == "turn":
        expected[ends[0]], expected[ends[1]] = 0.25, 1.0
    else:
        expected[ends[1]] = 1.25
    assert torch.equal(rewards, expected)
    assert out.non_tensor_batch["multi_turn_first_reward"].tolist() == [0.25]


def test_a_never_ending_environment_stops_after_exactly_max_assistant_turns(tiny_model_dir, tokenizer):
    eos = tokenizer.eos_token_id
    config = rollout_config(
        tiny_model_dir,
        f"{MT}.env_class=test_scripted",
        f"{MT}.env_kwargs.mode=forever",
        f"{MT}.max_assistant_turns=4",
        n=2,
        response_length=200,
    )
    engine = ScriptedEngine(config, tokenizer, [encode(tokenizer, "ok") + [eos]])
    out = engine.generate_sequences(chat_batch(tokenizer, [CHAT, CHAT]))
    assert engine.calls == 4 and len(out) == 4
    assert out.non_tensor_batch["multi_turn_turns"].tolist() == [4] * 4
    assert out.meta_info["metrics"]["multi_turn/finish_reason/max_turns"] == 1.0
    assert out.meta_info["metrics"]["multi_turn/turns/max"] == 4.0
    assert out.meta_info["metrics"]["multi_turn/env/steps"] == 4.0
    # The last turn ends the sequence: no observation after it.
    mask = out.batch["response_mask"][0]
    assert mask[int(out.batch["attention_mask"][0, out.batch["prompts"].shape[1] :].sum()) - 1] == 1


def test_max_user_turns_caps_the_environments_replies(tiny_model_dir, tokenizer):
    eos = tokenizer.eos_token_id
    config = rollout_config(
        tiny_model_dir,
        f"{MT}.env_class=test_scripted",
        f"{MT}.env_kwargs.mode=forever",
        f"{MT}.max_user_turns=1",
        response_length=200,
    )
    out = ScriptedEngine(config, tokenizer, [encode(tokenizer, "ok") + [eos]]).generate_sequences(
        chat_batch(tokenizer, [CHAT])
    )
    assert out.non_tensor_batch["multi_turn_turns"].tolist() == [2]
    assert out.non_tensor_batch["multi_turn_finish_reason"].tolist() == ["max_turns"]
    assert [
        v for v, _, _ in spans(out.batch["response_mask"][0, : int(out.batch["attention_mask"][0, 48:].sum())].tolist())
    ] == [1, 0, 1]


@pytest.mark.parametrize("limit", ["response_length", "max_model_len"])
def test_an_overflowing_trajectory_stays_within_the_budget(tiny_model_dir, tokenizer, limit):
    overrides = [f"{MT}.env_class=test_scripted", f"{MT}.env_kwargs.mode=forever", f"{MT}.max_tokens_per_turn=7"]
    config = rollout_config(tiny_model_dir, *overrides, response_length=40)
    if limit == "max_model_len":
        # An engine shorter than prompt + budget (the config check refuses this; an engine
        # built outside it may not): the engine, not the trajectory budget, is the bound.
        config = dataclasses.replace(config, max_model_len=60)
    engine = ScriptedEngine(config, tokenizer, [encode(tokenizer, "one two three four five six seven eight")])
    out = engine.generate_sequences(chat_batch(tokenizer, [CHAT], width=48))
    assert all(length + budget <= engine.max_model_len and budget <= 7 for length, budget in engine.requests)
    used = int(out.batch["attention_mask"][0, 48:].sum())
    prompt_len = int(out.batch["attention_mask"][0, :48].sum())
    assert used <= 40 and prompt_len + used <= engine.max_model_len
    assert out.non_tensor_batch["multi_turn_finish_reason"].tolist() == ["length"]
    assert out.batch["response_mask"][0, used - 1] == 1  # the observation that did not fit was dropped


# ---------------------------------------------------------------- time limits and errors


def test_a_sleeping_environment_is_cut_off_and_counted(tiny_model_dir, tokenizer):
    eos = tokenizer.eos_token_id
    config = rollout_config(
        tiny_model_dir,
        f"{MT}.env_class=test_scripted",
        f"{MT}.env_kwargs.mode=sleep",
        f"{MT}.env_step_timeout_s=0.5",
    )
    start = time.monotonic()
    out = ScriptedEngine(config, tokenizer, [encode(tokenizer, "68") + [eos]]).generate_sequences(
        chat_batch(tokenizer, [CHAT, CHAT, CHAT])
    )
    assert time.monotonic() - start < 10
    assert out.non_tensor_batch["multi_turn_finish_reason"].tolist() == ["done", "error", "done"]
    assert out.meta_info["metrics"]["multi_turn/env_timeouts"] == 1.0
    assert out.meta_info["metrics"]["multi_turn/finish_reason/error"] == pytest.approx(1 / 3)
    assert out.non_tensor_batch["multi_turn_error"][1].startswith("timeout")


def test_a_raising_environment_stops_the_run_or_is_counted(tiny_model_dir, tokenizer):
    eos = tokenizer.eos_token_id
    overrides = [f"{MT}.env_class=test_scripted", f"{MT}.env_kwargs.mode=raise"]
    script = [encode(tokenizer, "58") + [eos]]
    engine = ScriptedEngine(rollout_config(tiny_model_dir, *overrides), tokenizer, script)
    with pytest.raises(
        RuntimeError,
        match=r"environment ScriptedEnv raised ArithmeticError in step on row 1 "
        r"\(batch position 1, sample 0\): cannot judge '58'",
    ):
        engine.generate_sequences(chat_batch(tokenizer, [CHAT, CHAT]))
    from hybrid.errors import format_error

    with pytest.raises(RuntimeError) as raised:
        engine.generate_sequences(chat_batch(tokenizer, [CHAT, CHAT]))
    # The environment's own code raised: its frames (this file's), then one hybrid line.
    text = format_error(raised.value)
    assert text.startswith("Traceback (your code;") and "in step\n    raise ArithmeticError" in text
    assert "hybrid: environment ScriptedEnv raised ArithmeticError in step on row 1" in text
    malformed = [f"{MT}.env_class=test_scripted", f"{MT}.env_kwargs.mode=malformed"]
    with pytest.raises(RuntimeError) as broken:
        ScriptedEngine(rollout_config(tiny_model_dir, *malformed), tokenizer, script).generate_sequences(
            chat_batch(tokenizer, [CHAT, CHAT])
        )
    # A result that breaks the step contract: found by our check, one line, no traceback.
    assert format_error(broken.value) == (
        "hybrid: environment ScriptedEnv raised ValueError in step on row 1 (batch position 1, sample 0): step reward "
        f"must be a number, got str 'high' (set {MT}.tolerate_env_errors=true to end such trajectories instead)\n"
    )
    tolerant = rollout_config(tiny_model_dir, *overrides, f"{MT}.tolerate_env_errors=true")
    out = ScriptedEngine(tolerant, tokenizer, script).generate_sequences(chat_batch(tokenizer, [CHAT, CHAT]))
    assert out.non_tensor_batch["multi_turn_finish_reason"].tolist()[1] == "error"
    assert out.meta_info["metrics"]["multi_turn/env_errors"] == 1.0


TOOLS_YAML = """
tools:
  - class_name: reward.environments.python_tool.PythonTool
    config: {timeout_s: 1.5}
  - class_name: hanging_tool_mod.Hang
    config: {timeout_s: 0.5}
    tool_schema: {type: function, function: {name: hang, description: never returns, parameters: {}}}
"""
HANGING_TOOL = """
import time

class Hang:
    def __init__(self, config, tool_schema):
        pass
    def execute(self, instance_id, parameters):
        time.sleep(60)
"""


@pytest.fixture
def tool_config(tmp_path, monkeypatch):
    (tmp_path / "hanging_tool_mod.py").write_text(HANGING_TOOL)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "tools.yaml").write_text(TOOLS_YAML)
    return str(tmp_path / "tools.yaml")


def _tool_call(name, **arguments):
    import json

    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def test_tool_calls_are_answered_and_a_hanging_tool_is_cut_off(tiny_model_dir, tokenizer, tool_config):
    eos = tokenizer.eos_token_id
    calc, slow = _tool_call("python", code="23 + 45"), _tool_call("python", code="import time\ntime.sleep(60)")
    script = [encode(tokenizer, calc) + [eos], encode(tokenizer, slow) + [eos], encode(tokenizer, "68") + [eos]]
    config = rollout_config(
        tiny_model_dir,
        f"{MT}.tool_config_path={tool_config}",
        f"{MT}.env_class=test_scripted",
        f"{MT}.env_kwargs.mode=retry",
        response_length=200,
    )
    start = time.monotonic()
    out = ScriptedEngine(config, tokenizer, script).generate_sequences(chat_batch(tokenizer, [CHAT]))
    assert time.monotonic() - start < 15
    text = tokenizer.decode(out.batch["responses"][0][out.batch["attention_mask"][0, 48:].bool()])
    assert "<tool_response>\n68\n</tool_response>" in text
    # The Python tool enforces its own limit and says so; the model reads the answer.
    assert "<tool_response>\nError: timed out after 1.5 s\n</tool_response>" in text
    assert out.non_tensor_batch["multi_turn_finish_reason"].tolist() == ["done"]
    assert out.meta_info["metrics"]["multi_turn/env/tool_calls"] == 2.0

    # A tool that never returns is cut off at its timeout_s: the trajectory ends, counted.
    start = time.monotonic()
    hang = [encode(tokenizer, _tool_call("hang")) + [eos]]
    out = ScriptedEngine(config, tokenizer, hang).generate_sequences(chat_batch(tokenizer, [CHAT, CHAT]))
    assert time.monotonic() - start < 8  # 0.5 s limit + 2 s grace
    assert out.non_tensor_batch["multi_turn_finish_reason"].tolist() == ["error", "error"]
    assert out.meta_info["metrics"]["multi_turn/env_timeouts"] == 2.0
    assert "tool hang gave no answer within its timeout_s=0.5" in out.non_tensor_batch["multi_turn_error"][0]


def test_skyrl_gym_gsm8k_multi_turn_runs_unchanged(tiny_model_dir, tokenizer):
    pytest.importorskip("skyrl_gym", reason="skyrl-gym is not installed (pip install 'hybrid[env]')")
    eos = tokenizer.eos_token_id
    script = [encode(tokenizer, "I think 58") + [eos], encode(tokenizer, "#### 68") + [eos]]
    config = rollout_config(
        tiny_model_dir, f"{MT}.reward_placement=turn", f"{MT}.max_assistant_turns=3", response_length=200
    )
    batch = chat_batch(tokenizer, [CHAT], env_class=["gsm8k_multi_turn"])
    out = ScriptedEngine(config, tokenizer, script).generate_sequences(batch)
    assert out.non_tensor_batch["multi_turn_finish_reason"].tolist() == ["done"]
    assert out.non_tensor_batch["multi_turn_turns"].tolist() == [2]
    rewards = out.batch["env_rewards"][0]
    assert sorted(rewards[rewards != 0].tolist()) == [1.0]
    text = tokenizer.decode(out.batch["responses"][0][out.batch["attention_mask"][0, 48:].bool()])
    assert "#### ANSWER" in text  # gsm8k_multi_turn's own observation
    assert out.meta_info["metrics"]["multi_turn/env/steps"] == 2.0


# ---------------------------------------------------------------- the real engines


def _multi_turn_batch(tokenizer, rows=4):
    return chat_batch(tokenizer, [CHAT] * rows)


def _check_engine_output(out, engine, tokenizer, response_length):
    prompt_width = out.batch["prompts"].shape[1]
    for i in range(len(out)):
        used = int(out.batch["attention_mask"][i, prompt_width:].sum())
        mask = out.batch["response_mask"][i].tolist()
        assert used <= response_length and all(m == 0 for m in mask[used:])
        log_probs = out.batch["rollout_log_probs"][i]
        model = torch.tensor(mask, dtype=torch.bool)
        assert (log_probs[~model] == 0).all() and (log_probs[model] < 0).any()
        responses = out.batch["responses"][i].tolist()
        for value, a, b in spans(mask[:used]):
            if value == 0:
                assert RETRY_MESSAGE in tokenizer.decode(responses[a:b])
    assert engine.requests and max(length + budget for length, budget in engine.requests) <= engine.max_model_len


def _log_prob_gap(model_dir, out) -> float:
    """Mean |engine - folder model| log-prob over the model's tokens, the folder model
    reading the whole multi-turn sequence (observations included) as the actor does."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(
            input_ids=out.batch["input_ids"],
            attention_mask=out.batch["attention_mask"],
            position_ids=out.batch["position_ids"],
        ).logits.float()
    width = out.batch["prompts"].shape[1]
    steps = logits[:, width - 1 : -1].log_softmax(-1)
    actor = steps.gather(-1, out.batch["responses"].unsqueeze(-1)).squeeze(-1)
    mask = out.batch["response_mask"].bool()
    return float((actor - out.batch["rollout_log_probs"]).abs()[mask].mean())


def _recording(engine):
    """Wrap the real engine's generate_ids to record (prompt length, budget) of every request."""
    engine.requests = []
    inner = type(engine).generate_ids

    def generate_ids(prompt_ids, settings, max_tokens):
        engine.requests += [(len(p), m) for p, m in zip(prompt_ids, max_tokens)]
        return inner(engine, prompt_ids, settings, max_tokens)

    engine.generate_ids = generate_ids
    return engine


def test_hf_engine_runs_the_loop(tiny_model_dir, tokenizer):
    from transformers import AutoConfig

    from workers.rollout.hf_rollout import HFRollout

    overrides = [
        "actor_rollout_ref.rollout.name=hf",
        "actor_rollout_ref.rollout.load_format=hf",
        f"{MT}.env_class=arithmetic_retry",
        f"{MT}.max_tokens_per_turn=6",
    ]
    cfg = engine_config(tiny_model_dir, f"{MT}.enable=true", *overrides, n=2, response_length=40)
    hf_config = AutoConfig.from_pretrained(tiny_model_dir)
    engine = _recording(HFRollout(cfg.actor_rollout_ref.model, cfg.actor_rollout_ref.rollout, tokenizer, hf_config))
    out = engine.generate_sequences(_multi_turn_batch(tokenizer, rows=2))
    assert len(out) == 4 and out.meta_info["n"] == 2
    _check_engine_output(out, engine, tokenizer, 40)
    assert out.meta_info["metrics"]["multi_turn/turns/mean"] > 1  # the random model is never right
    assert _log_prob_gap(tiny_model_dir, out) < 1e-3


@pytest.mark.slow
def test_vllm_engine_runs_the_loop(tiny_model_dir, tokenizer):
    from transformers import AutoConfig

    from workers.rollout.vllm_rollout import VLLMRollout

    overrides = [
        "actor_rollout_ref.rollout.load_format=hf",
        f"{MT}.env_class=arithmetic_retry",
        f"{MT}.max_tokens_per_turn=6",
        "actor_rollout_ref.rollout.max_model_len=80",
    ]
    cfg = engine_config(tiny_model_dir, f"{MT}.enable=true", *overrides, n=2, response_length=40)
    hf_config = AutoConfig.from_pretrained(tiny_model_dir)
    engine = _recording(VLLMRollout(cfg.actor_rollout_ref.model, cfg.actor_rollout_ref.rollout, tokenizer, hf_config))
    out = engine.generate_sequences(_multi_turn_batch(tokenizer))
    assert len(out) == 8
    _check_engine_output(out, engine, tokenizer, 40)
    # 6-token turns and ~20-token observations fill the 40-token trajectory budget.
    assert out.meta_info["metrics"]["multi_turn/finish_reason/length"] > 0
    assert _log_prob_gap(tiny_model_dir, out) < 1e-3
    # Off again, the same engine rolls out single turns.
    engine.config = dataclasses.replace(
        engine.config, multi_turn=dataclasses.replace(engine.config.multi_turn, enable=False)
    )
    single = engine.generate_sequences(_multi_turn_batch(tokenizer))
    assert "env_rewards" not in single.batch.keys()
