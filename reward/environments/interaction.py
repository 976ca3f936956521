"""verl interactions (`multi_turn.interaction_config_path`) as environments.

verl's interaction YAML lists classes under `interaction:`, each with `class_name` (a
dotted import path), an optional `name` (default: the class name without "Interaction",
lower case) and `config` (passed to the constructor as a dict, with `name` added):

    interaction:
      - name: gsm8k
        class_name: my_pkg.interactions.Gsm8kInteraction
        config: {}

An interaction instance is shared by all trajectories and keeps per-trajectory state under
an instance id: `start_interaction(instance_id, **interaction_kwargs)`, then after each
model turn `generate_response(instance_id, messages, **interaction_kwargs) ->
(should_terminate, reply_text, turn_score, extra)`, and `finalize_interaction(instance_id)`
at the end. The row picks the interaction with `extra_info.interaction_kwargs.name` (as in
verl's datasets; with one interaction configured the name may be left out).
`InteractionEnv` maps that onto the environment contract: the reply becomes a user
message, the turn score the step's reward, termination `done`. Methods may be async.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping
from typing import Any

from reward.environments._calls import call, import_class
from reward.environments.base import BaseTextEnv, StepOutput

KEY = "actor_rollout_ref.rollout.multi_turn.interaction_config_path"


def _default_name(class_name: str) -> str:
    simple = class_name.rsplit(".", 1)[-1]
    return (simple[: -len("Interaction")] if simple.endswith("Interaction") else simple).lower()


def load_interactions(path: str) -> dict[str, Any]:
    """{name: interaction instance} from verl's interaction YAML at `path`."""
    from omegaconf import OmegaConf

    if not os.path.isfile(path):
        raise FileNotFoundError(f"{KEY}: {path!r} not found (working directory {os.getcwd()})")
    items = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    items = items.get("interaction") if isinstance(items, dict) else None
    if not items:
        raise ValueError(f"{KEY}: {path} has no 'interaction:' list (each item: name, class_name, config)")
    interactions: dict[str, Any] = {}
    for item in items:
        if not isinstance(item, dict) or "class_name" not in item:
            raise ValueError(f"{KEY}: every item of {path} needs a class_name, got {item!r}")
        name = item.get("name") or _default_name(item["class_name"])
        if name in interactions:
            raise ValueError(f"{KEY}: interaction name {name!r} appears twice in {path}")
        cls = import_class(item["class_name"], KEY)
        for method in ("start_interaction", "generate_response", "finalize_interaction"):
            if not callable(getattr(cls, method, None)):
                raise TypeError(f"{KEY}: {item['class_name']} has no {method} method (verl's BaseInteraction contract)")
        interactions[name] = cls(config={**(item.get("config") or {}), "name": name})
    return interactions


class InteractionEnv(BaseTextEnv):
    """One trajectory's conversation with a verl interaction."""

    def __init__(self, interactions: Mapping[str, Any], extras: Mapping[str, Any]):
        super().__init__(None, extras)
        extra_info = self.extras.get("extra_info") or {}
        self.kwargs = dict(extra_info.get("interaction_kwargs") or {}) if isinstance(extra_info, Mapping) else {}
        name = self.kwargs.get("name")
        if name is None and len(interactions) == 1:
            name = next(iter(interactions))
        if name not in interactions:
            raise ValueError(
                f"{KEY}: the row's extra_info.interaction_kwargs.name is {name!r}; configured interactions: "
                f"{sorted(interactions)}"
            )
        self.interaction = interactions[name]
        self.instance_id = uuid.uuid4().hex
        self.messages: list[dict[str, str]] = []
        self.started = False

    def init(self, prompt):
        self.messages = [dict(m) for m in prompt]
        call(self.interaction.start_interaction, self.instance_id, **self.kwargs)
        self.started = True
        return prompt, {}

    def step(self, action: str) -> StepOutput:
        self.turns += 1
        self.messages.append({"role": "assistant", "content": action})
        result = call(self.interaction.generate_response, self.instance_id, self.messages, **self.kwargs)
        if not isinstance(result, (tuple, list)) or len(result) < 3:
            raise ValueError(
                f"{type(self.interaction).__name__}.generate_response returned {result!r}; expected "
                f"(should_terminate, reply, score, extra)"
            )
        terminate, reply, score = bool(result[0]), result[1], result[2]
        observations = [] if terminate else [{"role": "user", "content": str(reply)}]
        self.messages.extend(observations)
        metadata = dict(result[3]) if len(result) > 3 and isinstance(result[3], Mapping) else {}
        return {"observations": observations, "reward": score, "done": terminate, "metadata": metadata}

    def close(self) -> None:
        if self.started:
            self.started = False
            call(self.interaction.finalize_interaction, self.instance_id)
