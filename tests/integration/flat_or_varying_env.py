"""A two-turn environment for the fully async dynamic-sampling test: a question whose answer is
even gets reward 5 whatever the model writes (its group is flat: dynamic sampling must drop
it); an odd one gets 1 or 0 by the parity of the action's characters (random text varies)."""

from __future__ import annotations

from reward.environments.base import BaseTextEnv

FLAT_REWARD = 5.0


class FlatOrVaryingEnv(BaseTextEnv):
    def __init__(self, env_config=None, extras=None):
        super().__init__(env_config, extras)
        spec = self.extras.get("reward_spec") or self.extras.get("reward_model") or {}
        self.flat = int(spec["ground_truth"]) % 2 == 0

    def step(self, action: str):
        self.turns += 1
        done = self.turns >= 2
        if self.flat:
            reward = FLAT_REWARD if done else 0.0
        else:
            reward = float(sum(map(ord, action)) % 2) if done else 0.0
        observations = [] if done else [{"role": "user", "content": "Again."}]
        return {"observations": observations, "reward": reward, "done": done, "metadata": {}}
