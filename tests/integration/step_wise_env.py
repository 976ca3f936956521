"""An environment for the step-wise training test: one or two model turns, by the parity of the
first answer's characters (random text varies, so a prompt's trajectories have different turn
counts); the last turn is rewarded 0, 1 or 2 by its characters, an earlier one 0.25 (a reward the
step-wise advantages must ignore: they are the last turn's)."""

from __future__ import annotations

from reward.environments.base import BaseTextEnv

AGAIN = "Again."
EARLIER_REWARD = 0.25


def last_turn_reward(action: str) -> float:
    return float(sum(map(ord, action)) % 3)


class OneOrTwoTurnsEnv(BaseTextEnv):
    def step(self, action: str):
        self.turns += 1
        done = self.turns >= 2 or sum(map(ord, action)) % 2 == 0
        reward = last_turn_reward(action) if done else EARLIER_REWARD
        observations = [] if done else [{"role": "user", "content": AGAIN}]
        return {"observations": observations, "reward": reward, "done": done, "metadata": {}}
