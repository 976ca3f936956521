"""Multi-turn rollouts: the model and an environment take turns, batched per turn.

With `actor_rollout_ref.rollout.multi_turn.enable` an engine's `generate_sequences` runs
`MultiTurnLoop`. Each prompt's n samples are n trajectories, each with its own environment
(reward/environments: the row's or the run's env_class, a verl interaction, verl tools).
One turn of the whole batch is:

1. ONE engine call (`generate_ids`) for every live trajectory, each with the budget
   min(max_tokens_per_turn, what is left of `response_length` (= data.max_response_length,
   the whole trajectory: model and observation tokens), what fits `max_model_len`);
2. every environment's `step(text of the turn)` in a pool of `env_workers` threads, each
   cut off after `env_step_timeout_s` (that trajectory ends, finish reason `error`);
3. the environments' replies appended, and the next turn.

Token in, token out: the sampled ids are kept exactly as sampled, and the next prompt is
the previous prompt plus those ids plus the observation ids, so the training sequence is
the sequence the model saw. Observations are rendered with the chat template against a
fixed base conversation and only the appended slice is kept (`ObservationRenderer`); the
base starts with a system message, so a template that injects a default system prompt
(SmolLM2's) does not inject it into observations. A model turn that ended without EOS
(its budget ran out, or a stop string) gets the EOS token before the observation, as the
template would close it, with mask 0: the model did not sample it. With
`use_conversation_multi_turn=false` observations are appended as plain text tokens.

A trajectory ends when its environment says done (`done`), after `max_assistant_turns`
model turns or `max_user_turns` observations (`max_turns`), when an observation does not
fit the budget (`length`: the observation is dropped, the trajectory ends on a model
turn), or on an environment error or time-out (`error`; an environment may also raise
`EnvTimeout` for a tool or server that did not answer in time). An environment that
raises anything else stops the run with its class, the row and the message, unless
`tolerate_env_errors`.

Output: the single-turn fields (prompts, responses, input_ids, attention_mask,
position_ids, response_mask, rollout_log_probs) where `response_mask` is 1 on the model's
tokens only, plus `env_rewards` (B, R): each step's reward on the last model token of its
turn (`reward_placement=turn`) or all of them summed on the final model token (`final`).
Per sample (non-tensor): `multi_turn_turns`, `multi_turn_finish_reason`,
`multi_turn_first_reward`, `multi_turn_reward`, `multi_turn_observation_tokens`,
`multi_turn_error`, `multi_turn_last_response` (the text of the final model turn),
`multi_turn_env_metrics`; `summarize` turns them into the
`multi_turn/*` metrics, which meta_info["metrics"] carries for this rank's samples.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import functools
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from protocol.data_proto import DataProto
from reward.environments import EnvFactory, EnvironmentFailed, EnvTimeout, check_step_output
from reward.environments.pool import Outcome, StepPool
from workers.rollout.base import sampling_settings

MULTI_TURN = "actor_rollout_ref.rollout.multi_turn"
FINISH_REASONS = ("done", "max_turns", "length", "error")
# A fixed conversation the observations are rendered after; it opens with a system
# message so no template adds its default one in front of an observation.
BASE_CONVERSATION = (
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "I am a user."},
    {"role": "assistant", "content": "I am an assistant."},
)


def _encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def render_prompt_ids(tokenizer, messages, tools=None) -> list[int]:
    """A chat prompt as the data loader renders it: template text, then tokens."""
    kwargs = {"tools": tools} if tools else {}
    text = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=False, **kwargs)
    return _encode(tokenizer, text)


class ObservationRenderer:
    """Observation messages -> the token ids the chat template appends for them after a
    model turn that ended with EOS (conversation mode), or their text's tokens (plain)."""

    def __init__(self, tokenizer, conversation: bool, eos_token_ids: set[int]):
        self.tokenizer = tokenizer
        self.conversation = conversation
        self.base_ids: list[int] = []
        # The cache belongs to this renderer (an lru_cache on the method would be shared by
        # every renderer and keep each one alive).
        self._render = functools.lru_cache(maxsize=4096)(self._render_uncached)
        if conversation:
            base = _encode(tokenizer, self._template(BASE_CONVERSATION, generation_prompt=False))
            ends = [i for i, tok in enumerate(base) if tok in eos_token_ids]
            if not ends:
                raise ValueError(
                    f"{MULTI_TURN}.use_conversation_multi_turn=true: the chat template does not end an assistant "
                    f"message with the EOS token, so observations cannot be appended after the model's turns; "
                    f"set use_conversation_multi_turn=false (observations as plain text)"
                )
            # The template's text after the assistant's EOS (ChatML's newline) belongs to
            # the observation, which follows the model's own EOS.
            self.base_ids = base[: ends[-1] + 1]

    def _template(self, messages, generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            list(messages), add_generation_prompt=generation_prompt, tokenize=False
        )

    def render(self, messages: list[dict[str, str]]) -> list[int]:
        return list(self._render(tuple((m["role"], m["content"]) for m in messages)))

    def _render_uncached(self, messages: tuple[tuple[str, str], ...]) -> tuple[int, ...]:
        if not self.conversation:
            return tuple(_encode(self.tokenizer, "".join(content for _, content in messages)))
        chat = list(BASE_CONVERSATION) + [{"role": role, "content": content} for role, content in messages]
        ids = _encode(self.tokenizer, self._template(chat, generation_prompt=True))
        if ids[: len(self.base_ids)] != self.base_ids:
            raise ValueError(
                "the chat template renders the conversation before an observation differently once the "
                f"observation is added; token-in-token-out needs it unchanged (set {MULTI_TURN}."
                "use_conversation_multi_turn=false to append observations as plain text)"
            )
        return tuple(ids[len(self.base_ids) :])


@dataclass
class Trajectory:
    row: int  # the prompt's position in the batch
    sample: int
    prompt_ids: list[int] = field(default_factory=list)
    prompt_rendered: bool = False  # False: the data loader's prompt tokens are used as they are
    env: object = None
    response_ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    rewards: list[tuple[int, float]] = field(default_factory=list)  # (response position, reward)
    turns: int = 0
    user_turns: int = 0
    observation_tokens: int = 0
    last_model_position: int | None = None
    last_turn_text: str = ""
    last_turn_closed: bool = True  # the last model turn ended with EOS
    finish: str | None = None
    error: str = ""
    env_metrics: dict = field(default_factory=dict)
    latency_s: float = 0.0  # mode=async: from its start to its end
    env_wait_s: float = 0.0  # mode=async: waiting for its environment
    # mode=async: per response token, the policy version whose weights sampled it (-1: not
    # the model's); filled by AgentRollout as turns return (weights may change between turns).
    versions: list[int] = field(default_factory=list)
    aborted_turns: int = 0  # mode=async: model turns aborted by a weight load and sampled again
    reward_loop: dict | None = None  # mode=async with the reward loop: its scores, as it finished
    steps: Any = None  # step_wise_trajectories: each turn's prompt and start (workers/rollout/step_wise.py)
    vision: Any = None  # a vision-language policy: the images so far (workers/rollout/multi_turn_images.py)


def template_renders_tool_responses(tokenizer) -> bool:
    """Qwen-style templates wrap `tool` messages in <tool_response> themselves."""
    template = getattr(tokenizer, "chat_template", None) or ""
    return "tool_response" in (template if isinstance(template, str) else str(template))


class MultiTurnLoop:
    """The loop over one engine (vLLM or HF): `engine` provides `generate_ids`, `config`
    (the rollout section), `tokenizer`, `eos_token_ids`, `pad_token_id`, `max_model_len`."""

    observation_parts = False  # observations are text messages (VisionLoop: content parts with images too)

    def __init__(self, engine):
        self.engine = engine
        self.config = engine.config
        self.settings = engine.config.multi_turn
        self.tokenizer = engine.tokenizer
        self.eos_token_ids = set(engine.eos_token_ids)
        eos = engine.tokenizer.eos_token_id
        self.eos_token_id = eos if eos is not None else min(self.eos_token_ids)
        self.factory = EnvFactory(self.settings, tool_role=template_renders_tool_responses(engine.tokenizer))
        self.renderer = ObservationRenderer(
            engine.tokenizer, self.settings.use_conversation_multi_turn, self.eos_token_ids
        )
        self.pool = StepPool(int(self.settings.env_workers), float(self.settings.env_step_timeout_s))

    @classmethod
    def for_engine(cls, engine, current: MultiTurnLoop | None) -> MultiTurnLoop | None:
        """The loop for the engine's current rollout section: None when multi-turn is off,
        `current` while the section is the one it was built from, a new loop otherwise."""
        if not engine.config.multi_turn.enable:
            return None
        if current is not None and current.config is engine.config:
            return current
        if current is not None:
            current.pool.shutdown()
        return cls(engine)

    # ------------------------------------------------------------------ the loop
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        settings = sampling_settings(self.config, prompts.meta_info)
        rows = self.rows_of(prompts)
        trajectories = [Trajectory(row=i, sample=s) for i in range(len(rows)) for s in range(settings.n)]
        self._start(trajectories, rows, prompts)
        turn_settings = dataclasses.replace(settings, n=1)
        while live := [t for t in trajectories if t.finish is None]:
            self._model_turn(live, turn_settings)
            self._env_turn(live, rows)
        self._close(trajectories, rows)
        return self.assemble(prompts, trajectories, settings.n)

    def rows_of(self, prompts: DataProto) -> list[dict]:
        fields = prompts.non_tensor_batch
        if "raw_prompt" not in fields:
            raise ValueError(
                f"{MULTI_TURN}.enable=true: the rollout needs each row's chat messages as the non-tensor field "
                f"'raw_prompt' (set data.return_raw_chat=true)"
            )
        return [{key: values[i] for key, values in fields.items()} for i in range(len(prompts))]

    def _row_label(self, trajectory: Trajectory, rows: list[dict]) -> str:
        """The data loader's row index (its `index` field) where there is one."""
        index = rows[trajectory.row].get("index")
        if index is None:
            return f"batch row {trajectory.row} (sample {trajectory.sample})"
        return f"row {index} (batch position {trajectory.row}, sample {trajectory.sample})"

    def _env_name(self, trajectory: Trajectory, rows: list[dict]) -> str:
        if trajectory.env is not None:
            return type(trajectory.env).__name__
        return self.factory.env_name(rows[trajectory.row]) or "environment"

    def _failed(self, trajectory: Trajectory, outcome: Outcome, rows: list[dict], phase: str) -> bool:
        """Whether the call failed; ends the trajectory (or the run) as configured."""
        if outcome.timed_out:
            trajectory.finish = "error"
            trajectory.error = f"timeout: {phase} ran past env_step_timeout_s={self.settings.env_step_timeout_s:g}"
            return True
        error = outcome.error
        if error is None:
            return False
        if isinstance(error, EnvTimeout):
            trajectory.finish = "error"
            trajectory.error = f"timeout: {error}"
            return True
        message = (
            f"environment {self._env_name(trajectory, rows)} raised {type(error).__name__} in {phase} on "
            f"{self._row_label(trajectory, rows)}: {error}"
        )
        if not self.settings.tolerate_env_errors:
            hint = f"set {MULTI_TURN}.tolerate_env_errors=true to end such trajectories instead"
            raise EnvironmentFailed(f"{message} ({hint})") from error
        trajectory.finish = "error"
        trajectory.error = message
        return True

    def _start(self, trajectories: list[Trajectory], rows: list[dict], prompts: DataProto) -> None:
        """Build and init every environment (in the pool: either may be slow), then the prompts."""
        outcomes = self.pool.run([self.opener(t, rows) for t in trajectories])
        for trajectory, outcome in zip(trajectories, outcomes):
            self.set_prompt(trajectory, outcome, rows, prompts)

    def _model_turn(self, live: list[Trajectory], settings) -> None:
        budgets = [self.budget(t) for t in live]
        turns = self.engine.generate_ids([self.turn_prompt(t) for t in live], settings, budgets)
        texts = self.tokenizer.batch_decode([list(turn.token_ids) for turn in turns], skip_special_tokens=True)
        for trajectory, turn, budget, text in zip(live, turns, budgets, texts):
            self.apply_turn(trajectory, turn, budget, text)

    def _env_turn(self, live: list[Trajectory], rows: list[dict]) -> None:
        outcomes = self.pool.run([self.stepper(t) for t in live])
        for trajectory, outcome in zip(live, outcomes):
            self.apply_step(trajectory, outcome, rows)

    def _close(self, trajectories: list[Trajectory], rows: list[dict]) -> None:
        """Episode metrics and close(); an environment still busy past its limit is left alone."""
        closing = [t for t in trajectories if self.closable(t)]
        for trajectory, outcome in zip(closing, self.pool.run([self.closer(t) for t in closing])):
            self.apply_close(trajectory, outcome, rows)

    # ------------------------------------------------------------------ one trajectory
    # The steps of one trajectory, shared by the lock-step loop above and the agent loops
    # of mode=async (workers/rollout/agent_loops.py), so both build the same tokens.
    def opener(self, trajectory: Trajectory, rows: list[dict]) -> Callable[[], Any]:
        """The call that builds the trajectory's environment and returns its `init`."""

        def open_env():
            trajectory.env = self.factory.make(rows[trajectory.row])
            messages = copy.deepcopy(_chat(rows[trajectory.row]["raw_prompt"]))
            return run_to_end(trajectory.env.init(messages))

        return open_env

    def set_prompt(self, trajectory: Trajectory, outcome: Outcome, rows: list[dict], prompts: DataProto) -> None:
        """The first prompt: the data loader's tokens, or the environment's messages rendered."""
        if self._failed(trajectory, outcome, rows, "init"):
            return
        input_ids, attention_mask = prompts.batch["input_ids"], prompts.batch["attention_mask"]
        messages = outcome.value[0] if isinstance(outcome.value, tuple) else outcome.value
        raw = _chat(rows[trajectory.row]["raw_prompt"])
        if _same_chat(messages, raw) and not self.factory.tools:
            row_ids, row_mask = input_ids[trajectory.row], attention_mask[trajectory.row]
            trajectory.prompt_ids = row_ids[row_mask.bool()].tolist()
        else:
            trajectory.prompt_ids = render_prompt_ids(self.tokenizer, messages, self.factory.tool_schemas)
            trajectory.prompt_rendered = True
            self._check_prompt_width(trajectory, rows, input_ids.shape[1])
        if self.budget(trajectory) < 1:
            trajectory.finish = "length"

    def _check_prompt_width(self, trajectory: Trajectory, rows, width: int, counted: str = "") -> None:
        """An environment's own first prompt must fit the width the batch's prompts were padded to."""
        if len(trajectory.prompt_ids) > width:
            raise ValueError(
                f"the environment's first prompt for {self._row_label(trajectory, rows)} is "
                f"{len(trajectory.prompt_ids)} tokens{counted}, longer than the prompt width {width} "
                f"(data.max_prompt_length)"
            )

    def turn_prompt(self, trajectory: Trajectory) -> list[int]:
        """What the next model turn continues: the prompt, the model's turns and the observations."""
        return trajectory.prompt_ids + trajectory.response_ids

    def budget(self, trajectory: Trajectory) -> int:
        """The next model turn's token budget."""
        used = len(trajectory.response_ids)
        room = min(
            int(self.config.response_length) - used, self.engine.max_model_len - len(trajectory.prompt_ids) - used
        )
        per_turn = self.settings.max_tokens_per_turn
        return min(room, int(per_turn)) if per_turn else room

    def apply_turn(self, trajectory: Trajectory, turn, budget: int, text: str) -> None:
        """The model's turn (`turn`: a GeneratedTurn; `text`: its decoded ids) joins the trajectory."""
        ids = list(turn.token_ids)[:budget]
        trajectory.response_ids += ids
        trajectory.mask += [1] * len(ids)
        trajectory.log_probs += [float(p) for p in list(turn.log_probs)[: len(ids)]]
        if ids:
            trajectory.last_model_position = len(trajectory.response_ids) - 1
        trajectory.turns += 1
        trajectory.last_turn_text = text
        trajectory.last_turn_closed = bool(ids) and ids[-1] in self.eos_token_ids

    def stepper(self, trajectory: Trajectory) -> Callable[[], Any]:
        """The call that steps the trajectory's environment with the model's last turn."""
        return lambda: run_to_end(trajectory.env.step(trajectory.last_turn_text))

    def apply_step(self, trajectory: Trajectory, outcome: Outcome, rows: list[dict]) -> None:
        """The environment's answer: its reward, the end of the trajectory, or the next observation."""
        if self._failed(trajectory, outcome, rows, "step"):
            return
        try:
            observations, reward, done, _ = check_step_output(outcome.value, parts=self.observation_parts)
        except ValueError as e:
            self._failed(trajectory, Outcome(error=e), rows, "step")
            return
        if trajectory.last_model_position is not None:
            trajectory.rewards.append((trajectory.last_model_position, reward))
        max_turns, max_user_turns = self.settings.max_assistant_turns, self.settings.max_user_turns
        if done:
            trajectory.finish = "done"
        elif (max_turns and trajectory.turns >= max_turns) or (
            max_user_turns is not None and trajectory.user_turns >= max_user_turns
        ):
            trajectory.finish = "max_turns"
        else:
            self._append_observation(trajectory, observations)

    def _append_observation(self, trajectory: Trajectory, observations: list[dict[str, str]]) -> None:
        self.append_observation_ids(trajectory, self.renderer.render(observations))

    def append_observation_ids(self, trajectory: Trajectory, ids: list[int]) -> bool:
        """The observation's rendered ids join the trajectory; False when they do not fit (it ends)."""
        if self.renderer.conversation and not trajectory.last_turn_closed:
            ids = [self.eos_token_id] + ids
        used = len(trajectory.response_ids) + len(ids)
        # The model must get at least one token after the observation: a trajectory ends on a model turn.
        if used >= int(self.config.response_length) or len(trajectory.prompt_ids) + used >= self.engine.max_model_len:
            trajectory.finish = "length"
            return False
        trajectory.response_ids += ids
        trajectory.mask += [0] * len(ids)
        trajectory.log_probs += [0.0] * len(ids)
        trajectory.user_turns += 1
        trajectory.observation_tokens += len(ids)
        if self.budget(trajectory) < 1:
            trajectory.finish = "length"
        return True

    def closable(self, trajectory: Trajectory) -> bool:
        return trajectory.env is not None and not trajectory.error.startswith("timeout")

    def closer(self, trajectory: Trajectory) -> Callable[[], Any]:
        """The call that collects the episode's metrics and closes its environment."""

        def finish():
            get_metrics = getattr(trajectory.env, "get_metrics", None)
            metrics = dict(get_metrics() or {}) if get_metrics is not None else {}
            run_to_end(trajectory.env.close())
            return metrics

        return finish

    def apply_close(self, trajectory: Trajectory, outcome: Outcome, rows: list[dict]) -> None:
        if not self._failed(trajectory, outcome, rows, "close"):
            trajectory.env_metrics = {k: v for k, v in outcome.value.items() if _is_number(v)}

    # ------------------------------------------------------------------ output
    def _rewards(self, trajectory: Trajectory, width: int) -> torch.Tensor:
        rewards = torch.zeros(width, dtype=torch.float32)
        if self.settings.reward_placement == "turn":
            for position, reward in trajectory.rewards:
                rewards[position] += reward
        elif trajectory.rewards and trajectory.last_model_position is not None:
            rewards[trajectory.last_model_position] = sum(r for _, r in trajectory.rewards)
        return rewards

    def assemble(
        self, prompts: DataProto, trajectories: list[Trajectory], n: int, width: int | None = None
    ) -> DataProto:
        """The samples; `width`: the prompts' (default the data loader's), rendered prompts left-padded to it."""
        width = prompts.batch["input_ids"].shape[1] if width is None else width
        length = int(self.config.response_length)
        pad = self.engine.pad_token_id
        tensors = {
            k: [] for k in ("prompts", "prompt_mask", "responses", "response_mask", "rollout_log_probs", "env_rewards")
        }
        for t in trajectories:
            if t.prompt_rendered:
                ids, mask = _left_pad(t.prompt_ids, width, pad)
            else:
                ids, mask = prompts.batch["input_ids"][t.row], prompts.batch["attention_mask"][t.row]
            size = len(t.response_ids)
            tensors["prompts"].append(ids)
            tensors["prompt_mask"].append(mask)
            tensors["responses"].append(torch.tensor(t.response_ids + [pad] * (length - size), dtype=torch.long))
            tensors["response_mask"].append(torch.tensor(t.mask + [0] * (length - size), dtype=torch.long))
            tensors["rollout_log_probs"].append(
                torch.tensor(t.log_probs + [0.0] * (length - size), dtype=torch.float32)
            )
            tensors["env_rewards"].append(self._rewards(t, length))
        batch = {k: torch.stack(v) for k, v in tensors.items()}
        prompt_mask = batch.pop("prompt_mask")
        real = torch.tensor([[1] * len(t.response_ids) + [0] * (length - len(t.response_ids)) for t in trajectories])
        prompt_pos = torch.clamp(prompt_mask.cumsum(-1) - 1, min=0)
        response_pos = prompt_pos[:, -1:] + torch.arange(1, length + 1).unsqueeze(0)
        batch.update(
            input_ids=torch.cat([batch["prompts"], batch["responses"]], -1),
            attention_mask=torch.cat([prompt_mask, real.long()], -1),
            position_ids=torch.cat([prompt_pos, response_pos], -1),
        )
        non_tensors = _per_sample_fields(trajectories)
        return DataProto.from_dict(
            tensors=batch, non_tensors=non_tensors, meta_info={"n": n, "metrics": summarize(non_tensors)}
        )


def run_to_end(result):
    """An environment method's result; one that is a coroutine (an `async def` method) is run
    to its end here, on the pool thread that called it (the lock-step loop is synchronous)."""
    return asyncio.run(result) if inspect.iscoroutine(result) else result


def _chat(raw_prompt) -> list[dict]:
    """The row's prompt as chat messages (a plain string is one user message)."""
    if isinstance(raw_prompt, str):
        return [{"role": "user", "content": raw_prompt}]
    if isinstance(raw_prompt, np.ndarray):
        raw_prompt = raw_prompt.tolist()
    return [dict(m) for m in raw_prompt]


def _same_chat(a, b) -> bool:
    try:
        return [(m["role"], m["content"]) for m in a] == [(m["role"], m["content"]) for m in b]
    except (KeyError, TypeError):
        return False


def _left_pad(ids: list[int], width: int, pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    n_pad = width - len(ids)
    return (
        torch.tensor([pad] * n_pad + list(ids), dtype=torch.long),
        torch.tensor([0] * n_pad + [1] * len(ids), dtype=torch.long),
    )


def _is_number(value) -> bool:
    # Booleans count as 0/1 (e.g. "solved"); strings and containers are not averaged.
    return isinstance(value, (bool, int, float, np.number, np.bool_))


def _per_sample_fields(trajectories: list[Trajectory]) -> dict[str, np.ndarray]:
    def column(values):
        array = np.empty(len(values), dtype=object)
        array[:] = values
        return array

    return {
        "multi_turn_turns": column([t.turns for t in trajectories]),
        "multi_turn_finish_reason": column([t.finish for t in trajectories]),
        "multi_turn_first_reward": column([t.rewards[0][1] if t.rewards else math.nan for t in trajectories]),
        "multi_turn_reward": column([float(sum(r for _, r in t.rewards)) for t in trajectories]),
        "multi_turn_observation_tokens": column([t.observation_tokens for t in trajectories]),
        "multi_turn_error": column([t.error for t in trajectories]),
        "multi_turn_last_response": column([t.last_turn_text for t in trajectories]),
        "multi_turn_env_metrics": column([t.env_metrics for t in trajectories]),
    }


def summarize(non_tensor_batch) -> dict[str, float]:
    """`multi_turn/*` metrics from the per-sample fields (of one rank, or of the whole
    batch once the driver has the ranks' outputs concatenated)."""
    turns = np.asarray(list(non_tensor_batch["multi_turn_turns"]), dtype=np.float64)
    if turns.size == 0:
        return {}
    reasons = list(non_tensor_batch["multi_turn_finish_reason"])
    errors = list(non_tensor_batch["multi_turn_error"])
    first = np.asarray(list(non_tensor_batch["multi_turn_first_reward"]), dtype=np.float64)
    metrics = {
        "multi_turn/turns/mean": float(turns.mean()),
        "multi_turn/turns/max": float(turns.max()),
        "multi_turn/observation_tokens/mean": float(np.mean(list(non_tensor_batch["multi_turn_observation_tokens"]))),
        "multi_turn/reward/mean": float(np.mean(list(non_tensor_batch["multi_turn_reward"]))),
        "multi_turn/first_turn_reward/mean": float(np.nanmean(first)) if np.isfinite(first).any() else math.nan,
        "multi_turn/env_timeouts": float(sum(e.startswith("timeout") for e in errors)),
        "multi_turn/env_errors": float(sum(bool(e) and not e.startswith("timeout") for e in errors)),
    }
    for reason in FINISH_REASONS:
        metrics[f"multi_turn/finish_reason/{reason}"] = sum(r == reason for r in reasons) / len(reasons)
    collected: dict[str, list[float]] = {}
    for env_metrics in non_tensor_batch["multi_turn_env_metrics"]:
        for key, value in (env_metrics or {}).items():
            collected.setdefault(key, []).append(float(value))
    for key, values in sorted(collected.items()):
        metrics[f"multi_turn/env/{key}"] = float(np.mean(values))
    return metrics
