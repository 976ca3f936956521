"""`arithmetic_retry`: the default task's question, with another try after a wrong answer.

The row is one of hybrid's arithmetic rows ("What is 23 + 45? Reply with only the
number.", ground truth in `reward_model.ground_truth`). A response is right when its last
integer is the answer (`reward.scorers.arithmetic`, the same scorer the single-turn task
uses). A right answer ends the episode with reward 1; a wrong one gets the user message
"Incorrect, try again." until `max_attempts` answers have been given (env_kwargs
`max_attempts`, else the row's `max_turns`, else 3), and the last wrong answer ends it
with reward 0. It needs no network and no files, so a 135M model can learn on it offline.
"""

from __future__ import annotations

from typing import Any

from reward.environments.base import BaseTextEnv, StepOutput
from reward.environments.registry import register_env
from reward.scorers.arithmetic import compute_score

RETRY_MESSAGE = "Incorrect, try again."
DEFAULT_MAX_ATTEMPTS = 3


def _setting(env_config, key: str):
    if env_config is None:
        return None
    return env_config[key] if key in env_config else None


@register_env("arithmetic_retry")
class ArithmeticRetryEnv(BaseTextEnv):
    def __init__(self, env_config: Any = None, extras: dict | None = None):
        super().__init__(env_config, extras)
        reward_spec = self.extras.get("reward_spec") or self.extras.get("reward_model") or {}
        if "ground_truth" not in reward_spec:
            raise ValueError("arithmetic_retry needs the row's reward_model.ground_truth")
        self.ground_truth = reward_spec["ground_truth"]
        attempts = _setting(env_config, "max_attempts") or self.extras.get("max_turns") or DEFAULT_MAX_ATTEMPTS
        self.max_attempts = int(attempts)
        if self.max_attempts < 1:
            raise ValueError(f"arithmetic_retry: max_attempts must be >= 1, got {self.max_attempts}")
        self.solved = False
        self.first_correct = False

    def step(self, action: str) -> StepOutput:
        self.turns += 1
        correct = compute_score(action, self.ground_truth) == 1.0
        if self.turns == 1:
            self.first_correct = correct
        self.solved = correct
        done = correct or self.turns >= self.max_attempts
        observations = [] if done else [{"role": "user", "content": RETRY_MESSAGE}]
        return {"observations": observations, "reward": 1.0 if correct else 0.0, "done": done, "metadata": {}}

    def get_metrics(self) -> dict[str, Any]:
        return {
            "attempts": self.turns,
            "solved": float(self.solved),
            "first_attempt_correct": float(self.first_correct),
        }
