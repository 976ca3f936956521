"""The latency environment of scripts/bench_async.py: arithmetic_retry behind a slow service
whose every step awaits a seeded lognormal wait, the same wait for the same trajectory and
turn in every training mode. Loaded by path (`multi_turn.env_class=<this file>:LatencyRetryEnv`)
in whichever process steps the environments."""

from __future__ import annotations

import asyncio
import math
import threading

import numpy as np

from reward.environments.arithmetic_retry import ArithmeticRetryEnv

SPLITS = {"train": 0, "val": 1, "test": 2}


def lognormal_mu(mean: float, sigma: float) -> float:
    """The mu that gives a lognormal of this mean: E = exp(mu + sigma^2 / 2)."""
    return math.log(mean) - sigma * sigma / 2


def draw_latency(seed: int, split: int, index: int, sample: int, turn: int, mean: float, sigma: float) -> float:
    """The wait before environment step `turn` (1-based) of the `sample`th trajectory of row
    `index`: the same in every mode, whatever order the steps run in. Zero when mean <= 0."""
    if mean <= 0:
        return 0.0
    rng = np.random.default_rng([seed, split, index, sample, turn])
    return float(rng.lognormal(lognormal_mu(mean, sigma), sigma))


class LatencyRetryEnv(ArithmeticRetryEnv):
    """arithmetic_retry behind a slow service: each `step` first awaits (asyncio.sleep, an async
    client) its drawn wait. env_kwargs: seed, latency_mean, latency_sigma. A row's trajectories
    are numbered 0, 1, ... in the order this process makes them, so a prompt's n samples wait
    the same draws in every mode (a prompt generated again after a drop draws anew)."""

    _made: dict = {}
    _lock = threading.Lock()

    def __init__(self, env_config=None, extras=None):
        super().__init__(env_config, extras)
        info = self.extras.get("extra_info") or {}
        self.row = (SPLITS.get(str(info.get("split", "train")), 3), int(info.get("index", self.extras.get("index", 0))))
        with LatencyRetryEnv._lock:
            self.sample = LatencyRetryEnv._made.get(self.row, 0)
            LatencyRetryEnv._made[self.row] = self.sample + 1
        self.waited = 0.0

    def wait_s(self, turn: int) -> float:
        config = self.env_config or {}
        mean, sigma = float(config.get("latency_mean", 1.0)), float(config.get("latency_sigma", 1.0))
        return draw_latency(int(config.get("seed", 0)), *self.row, self.sample, turn, mean, sigma)

    async def step(self, action):
        wait = self.wait_s(self.turns + 1)
        if wait > 0:
            await asyncio.sleep(wait)
        self.waited += wait
        return super().step(action)

    def get_metrics(self) -> dict:
        return {**super().get_metrics(), "env_latency_s": self.waited}
