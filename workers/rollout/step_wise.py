"""Step-wise trajectories (`multi_turn.step_wise_trajectories`, SkyRL's
generator.step_wise_trajectories): every model turn of an episode is a sample of its own.

Before every turn the whole chat history (the prompt's messages, the model's earlier turns as
assistant messages, the environment's observations) is rendered again with the chat template,
and the model continues that text: a template that rewrites earlier turns (Qwen3 drops the
thinking of every assistant turn before the last user message) changes what the model sees,
and what it is trained on. A turn's sample is

    prompt   = the history as rendered before the turn (left-padded to prompt_length +
               response_length, the widest history a turn may start from);
    response = the turn's tokens (mask 1, the engine's log-probs), then, as SkyRL's
               skyrl_gym_generator, the tokens the loop appends after it: the EOS that closes a
               turn which did not end with one and the observation rendered against the fixed
               base conversation (mask 0), cut to response_length.

A turn's budget: min(max_tokens_per_turn, response_length, the window (prompt_length +
response_length, and the engine's max_model_len) minus its history); a trajectory whose next
history leaves no token ends (`length`). Rewards: with `reward_placement=turn` each sample
carries its own turn's reward on its last model token (SkyRL's per-step rewards), with `final`
the last sample carries the trajectory's summed reward there. `step_wise_last` (B,) marks each
trajectory's last sample; a trajectory's samples are adjacent and in order, the trajectories in
the order of the non-step-wise output (a prompt's n samples adjacent), so the driver maps each
sample to its trajectory (hybrid/step_wise.py: the advantages of the last sample go to every
sample of its trajectory). A trajectory without a model turn (its environment failed to start,
its prompt left no budget) is one sample with an empty response. Per-sample fields
(`multi_turn_*`) are the trajectory's, repeated on its samples; the `multi_turn/*` metrics count
trajectories.

The lock-step loop and the agent loops (`environment_agent`, `tool_agent`) build the same
samples: both call `turn_prompt`, `budget`, `apply_turn` and `apply_step` of the loop.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import numpy as np
import torch

from protocol.data_proto import DataProto
from workers.rollout.multi_turn import (
    MULTI_TURN,
    MultiTurnLoop,
    Trajectory,
    _per_sample_fields,
    render_prompt_ids,
    summarize,
)
from workers.rollout.multi_turn_images import VisionLoop

STEP_WISE_LAST = "step_wise_last"  # (B,) bool: the sample is its trajectory's last turn


@dataclass
class Steps:
    """One trajectory's chat history and, per model turn, the prompt it continued and where
    its tokens start in the trajectory's `response_ids` (turns and observations, in order)."""

    history: list[dict]
    prompt: list[int]  # what the next turn continues
    prompts: list[list[int]] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)


def loop_for_engine(engine, current: MultiTurnLoop | None) -> MultiTurnLoop | None:
    """The multi-turn loop for the engine's rollout section: `StepWiseLoop` with
    step_wise_trajectories, `MultiTurnLoop` otherwise (None when multi-turn is off)."""
    multi_turn = engine.config.multi_turn
    cls = StepWiseLoop if multi_turn.enable and multi_turn.step_wise_trajectories else MultiTurnLoop
    if cls is MultiTurnLoop and getattr(engine, "processor", None) is not None:
        cls = VisionLoop  # images in the episodes (workers/rollout/multi_turn_images.py)
    if current is not None and type(current) is not cls:
        current.pool.shutdown()
        current = None
    return cls.for_engine(engine, current)


def trajectory_index(last: torch.Tensor) -> np.ndarray:
    """Each sample's trajectory (0, 1, ...) from `step_wise_last`: a trajectory ends at each True."""
    last = last.bool()
    if len(last) and not bool(last[-1]):
        raise ValueError(f"{STEP_WISE_LAST}: the last sample does not end a trajectory")
    starts = torch.cat([torch.zeros(1, dtype=torch.long), last[:-1].long()]) if len(last) else last.long()
    return starts.cumsum(0).numpy()


def expand_fields(fields: dict[str, np.ndarray], output: DataProto) -> dict[str, np.ndarray]:
    """Per-trajectory columns repeated on each of the trajectory's samples."""
    index = trajectory_index(output.batch[STEP_WISE_LAST])
    return {key: values[index] for key, values in fields.items()}


class StepWiseLoop(MultiTurnLoop):
    """The multi-turn loop with a sample per model turn (the module's docstring)."""

    def __init__(self, engine):
        super().__init__(engine)
        if not self.renderer.conversation:
            raise ValueError(
                f"{MULTI_TURN}.step_wise_trajectories=true renders the chat history with the chat template before "
                f"every turn: set {MULTI_TURN}.use_conversation_multi_turn=true"
            )
        self.window = min(int(self.config.prompt_length) + int(self.config.response_length), engine.max_model_len)

    def set_prompt(self, trajectory: Trajectory, outcome, rows: list[dict], prompts: DataProto) -> None:
        super().set_prompt(trajectory, outcome, rows, prompts)
        if trajectory.prompt_ids:  # the environment started: its messages begin the history
            messages = outcome.value[0] if isinstance(outcome.value, tuple) else outcome.value
            trajectory.steps = Steps(history=copy.deepcopy(list(messages)), prompt=list(trajectory.prompt_ids))

    def turn_prompt(self, trajectory: Trajectory) -> list[int]:
        return trajectory.prompt_ids if trajectory.steps is None else trajectory.steps.prompt

    def budget(self, trajectory: Trajectory) -> int:
        room = min(self.window - len(self.turn_prompt(trajectory)), int(self.config.response_length))
        per_turn = self.settings.max_tokens_per_turn
        return min(room, int(per_turn)) if per_turn else room

    def apply_turn(self, trajectory: Trajectory, turn, budget: int, text: str) -> None:
        steps = trajectory.steps
        steps.prompts.append(steps.prompt)
        steps.starts.append(len(trajectory.response_ids))
        super().apply_turn(trajectory, turn, budget, text)

    def _append_observation(self, trajectory: Trajectory, observations: list[dict[str, str]]) -> None:
        """The observation joins the turn's sample (mask 0) and the history; the next turn
        continues the history rendered again."""
        ids = self.renderer.render(observations)
        if not trajectory.last_turn_closed:
            ids = [self.eos_token_id] + ids
        trajectory.response_ids += ids
        trajectory.mask += [0] * len(ids)
        trajectory.log_probs += [0.0] * len(ids)
        trajectory.user_turns += 1
        trajectory.observation_tokens += len(ids)
        steps = trajectory.steps
        steps.history += [{"role": "assistant", "content": trajectory.last_turn_text}, *observations]
        steps.prompt = render_prompt_ids(self.tokenizer, steps.history, self.factory.tool_schemas)
        if self.budget(trajectory) < 1:
            trajectory.finish = "length"

    # ------------------------------------------------------------------ output
    def assemble(
        self, prompts: DataProto, trajectories: list[Trajectory], n: int, width: int | None = None
    ) -> DataProto:
        samples, last, origin = [], [], []
        for index, trajectory in enumerate(trajectories):
            pieces = self.pieces(trajectory, prompts)
            samples += pieces
            origin += [index] * len(pieces)
            last += [False] * (len(pieces) - 1) + [True]
        output = super().assemble(prompts, samples, n, width=self.window)
        output.batch[STEP_WISE_LAST] = torch.tensor(last, dtype=torch.bool)
        fields = _per_sample_fields(trajectories)
        output.non_tensor_batch = {key: values[np.asarray(origin, dtype=np.int64)] for key, values in fields.items()}
        output.meta_info["metrics"] = summarize(fields)
        return output

    def pieces(self, trajectory: Trajectory, prompts: DataProto) -> list[Trajectory]:
        """The trajectory's samples (`turn_samples`); the first prompt of a trajectory that has
        none (its environment failed to start) is the data loader's."""
        first = list(trajectory.prompt_ids)
        if not first:
            ids, mask = prompts.batch["input_ids"][trajectory.row], prompts.batch["attention_mask"][trajectory.row]
            first = ids[mask.bool()].tolist()
        return turn_samples(trajectory, first, int(self.config.response_length), self.settings.reward_placement)


def turn_samples(trajectory: Trajectory, first_prompt: list[int], length: int, placement: str) -> list[Trajectory]:
    """A trajectory's samples, one per model turn, each as a trajectory of one turn: the prompt
    the turn continued; the turn's tokens and what followed them up to the next turn, cut to
    `length`; the rewards on its tokens (`placement` turn), or the trajectory's sum on the last
    sample's last model token (`final`). A trajectory without recorded turns is one sample."""
    steps = trajectory.steps
    if steps is None or not steps.starts:
        if trajectory.turns > 1:
            raise ValueError(
                f"{MULTI_TURN}.step_wise_trajectories=true: an agent loop ran {trajectory.turns} model turns "
                f"without recording them; only the environment_agent and tool_agent loops split trajectories "
                f"into turns"
            )
        pieces = [_piece(trajectory, first_prompt, 0, len(trajectory.response_ids))]
    else:
        ends = steps.starts[1:] + [len(trajectory.response_ids)]
        pieces = [_piece(trajectory, p, s, e) for p, s, e in zip(steps.prompts, steps.starts, ends)]
    if placement == "final":
        # The trajectory's summed reward on the last sample's last model token, as on the whole trajectory.
        for piece in pieces:
            piece.rewards = []
        if trajectory.rewards and pieces[-1].last_model_position is not None:
            pieces[-1].rewards = [(pieces[-1].last_model_position, sum(r for _, r in trajectory.rewards))]
    for piece in pieces:
        del piece.response_ids[length:], piece.mask[length:], piece.log_probs[length:]
    return pieces


def _piece(trajectory: Trajectory, prompt: list[int], start: int, end: int) -> Trajectory:
    mask = trajectory.mask[start:end]
    model = [i for i, m in enumerate(mask) if m]
    return Trajectory(
        row=trajectory.row,
        sample=trajectory.sample,
        prompt_ids=list(prompt),
        prompt_rendered=True,
        response_ids=trajectory.response_ids[start:end],
        mask=mask,
        log_probs=trajectory.log_probs[start:end],
        rewards=[(p - start, r) for p, r in trajectory.rewards if start <= p < end],
        last_model_position=model[-1] if model else None,
    )


__all__ = [
    "STEP_WISE_LAST",
    "StepWiseLoop",
    "Steps",
    "expand_fields",
    "loop_for_engine",
    "trajectory_index",
    "turn_samples",
]
