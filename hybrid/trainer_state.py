"""The driver's resumable state, one object: the global step, the training data's position
(the sampler's state; with asynchronous training also the prompt stream's, which says which
prompts were handed out and not yet trained), the adaptive KL coefficient and the driver's
random generators.
hybrid/checkpointing.py saves `state_dict()` into a checkpoint's data.pt and hands it back
through `load_state_dict`; the workers save their own state beside it.

Every value is a plain Python value or a CPU tensor, so data.pt loads with
`torch.load(..., weights_only=True)`.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


class TrainerState:
    def __init__(self, train_dataloader, kl_ctrl=None, stream=None):
        self.global_step = 0  # the step in progress, or the last finished one between steps
        self.train_dataloader = train_dataloader  # a StatefulDataLoader: its state is the data position
        self.kl_ctrl = kl_ctrl  # the adaptive KL controller of algorithm.use_kl_in_reward, if any
        self.stream = stream  # asynchronous training's PromptStream (hybrid/prompt_stream.py), if any

    def state_dict(self) -> dict[str, Any]:
        return {
            "global_step": int(self.global_step),
            "dataloader": self.train_dataloader.state_dict(),
            "kl_coef": float(self.kl_ctrl.value) if self.kl_ctrl is not None else None,
            "rng": _rng_state(),
            "stream": self.stream.state_dict() if self.stream is not None else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.global_step = int(state["global_step"])
        self.train_dataloader.load_state_dict(state["dataloader"])
        if self.kl_ctrl is not None and state.get("kl_coef") is not None:
            self.kl_ctrl.value = float(state["kl_coef"])
        if state.get("rng") is not None:  # absent in checkpoints written before it was kept
            _set_rng_state(state["rng"])
        if self.stream is not None:
            if state.get("stream") is None:
                raise ValueError(
                    "the checkpoint was written by a run without asynchronous training: it has no prompt stream "
                    "position to resume from; resume it with async_training off, or start fresh"
                )
            self.stream.load_state_dict(state["stream"])


def _rng_state() -> dict[str, Any]:
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch": torch.get_rng_state(),
    }


def _set_rng_state(state: dict[str, Any]) -> None:
    python = state["python"]
    random.setstate((python[0], tuple(python[1]), python[2]))
    n = state["numpy"]
    keys = n["keys"].numpy().astype(np.uint32)
    np.random.set_state((n["kind"], keys, n["pos"], n["has_gauss"], n["cached_gaussian"]))
    torch.set_rng_state(state["torch"])


__all__ = ["TrainerState"]
