"""What ROLL's grid-game environments (Sokoban, FrozenLake) share, as hybrid environments.

ROLL plays them through its TrajEnvManager (roll/pipeline/agentic/env_manager/traj_env_manager.py):
`env.reset(seed)` makes the episode's board, each model turn is parsed for one action
(roll/pipeline/agentic/env/parse_action_utils.py: the first match of `action_pattern`, its last
group compared case-insensitively with the action names; no match or an unknown name is an
invalid action), and the manager renders every observation into a chat turn with the
section's templates: the first turn is the system message `agent_system_template` and the user
message `env_instruction + "\\n" + agent_template`, later ones a user message
`agent_template`, whose fields are `observation`, `turn_idx` (1-based), `actions_left` and
`max_response_length` (max_tokens_per_step). The episode ends when the game says so or after
`max_actions` actions (custom_envs.<tag>.max_steps); its score is the sum of the step rewards.

Here one `GridGameEnv` is one trajectory: `init` ignores the dataset prompt and returns the
rendered first turn (the row only names the board: its `seed`, and its `tag`), `step` plays the
turn and answers with the next rendered observation. Settings come from `env_config`
(multi_turn.env_kwargs, the environment's own section merged in): with a row `tag`, the section
`tags.<tag>` holds that tag's settings (the ROLL dialect writes ROLL's custom_envs there), else
the settings are the keys themselves.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from reward.environments.base import BaseTextEnv, StepOutput
from reward.environments.factory import plain

SPECIAL_TOKENS = ("<|im_start|>", "<|im_end|>")
ACTION_PATTERN = r"<answer>(.*?)</answer>"
# Keys the env manager reads (not the game): custom_envs.<tag>.max_steps, max_tokens_per_step and the templates.
EPISODE_KEYS = ("max_actions", "max_tokens_per_step", "agent_system_template", "agent_template")
DEFAULT_SYSTEM = (
    "You're a helpful assistant. You are a good game player. You are aiming to get high reward in the game."
)
DEFAULT_TEMPLATE = "{observation}"


def parse_action(text: str, pattern: str, lookup: Mapping[int, str], special_tokens=SPECIAL_TOKENS) -> dict:
    """ROLL's default_parser_action_func: {'action': id or None, 'action_content', 'think_content'}."""
    for token in special_tokens or ():
        text = text.replace(token, "").strip()
    match = re.search(pattern, text, re.DOTALL)
    if not match:
        return {"action": None, "action_content": "", "think_content": ""}
    groups = match.groups()
    think, content = ("", groups[0]) if len(groups) == 1 else (groups[0], groups[1])
    content, think = (content or "").strip(), (think or "").strip()
    names = {name.lower(): action for action, name in lookup.items()}
    return {"action": names.get(content.lower()), "action_content": content, "think_content": think}


def int_keys(mapping: Mapping | None) -> dict | None:
    """A lookup table read from a config: its keys back to ints ('0' -> 0), as ROLL's YAML has them."""
    if mapping is None:
        return None
    return {int(k): v for k, v in dict(mapping).items()}


def render(template: str, **fields: Any) -> str:
    """str.format with only the fields the template names (ROLL fills only those it finds)."""
    return template.format_map({k: v for k, v in fields.items() if "{" + k + "}" in template})


def settings_of(env_config: Any, extras: Mapping[str, Any], name: str) -> dict[str, Any]:
    """This episode's settings: env_config's `tags.<row tag>` section when the row has a tag."""
    config = plain(env_config) if env_config is not None else {}
    tag = extras.get("tag")
    if tag is None:
        return {k: v for k, v in config.items() if k != "tags"}
    tags = config.get("tags") or {}
    if tag not in tags:
        raise ValueError(
            f"{name}: the row's tag {tag!r} has no section in multi_turn.env_kwargs.tags "
            f"(has: {sorted(tags) or 'none'})"
        )
    return dict(tags[tag])


def episode_seed(extras: Mapping[str, Any], name: str) -> int:
    seed = extras.get("seed")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"{name}: the row needs an integer 'seed' column (the board is made from it), got {seed!r}")
    return seed


class GridGameEnv(BaseTextEnv):
    """A ROLL grid game behind skyrl-gym's contract. Subclasses set NAME and implement
    `make(settings)`, `reset(seed) -> observation`, `play(action or None) -> (reward, done)`,
    `render_board()`, `instructions()` and `success()`."""

    NAME = "grid_game"
    GAME_KEYS: tuple[str, ...] = ()

    def __init__(self, env_config: Any = None, extras: Mapping[str, Any] | None = None):
        super().__init__(env_config, extras)
        settings = settings_of(env_config, self.extras, self.NAME)
        unknown = sorted(set(settings) - set(self.GAME_KEYS) - set(EPISODE_KEYS))
        if unknown:
            raise ValueError(f"{self.NAME}: unknown settings {unknown}; known: {sorted(self.GAME_KEYS + EPISODE_KEYS)}")
        self.max_actions = int(settings.get("max_actions") or self.extras.get("max_turns") or 10)
        self.max_tokens_per_step = settings.get("max_tokens_per_step")
        self.system_template = settings.get("agent_system_template") or DEFAULT_SYSTEM
        self.template = settings.get("agent_template") or DEFAULT_TEMPLATE
        self.action_pattern = settings.get("action_pattern", ACTION_PATTERN)
        self.format_penalty = float(settings.get("format_penalty", 0.0))
        tokens = settings.get("special_token_list", SPECIAL_TOKENS)
        self.special_tokens = tuple(tokens) if tokens is not None else ()
        if settings.get("render_mode", "text") != "text":
            raise ValueError(f"{self.NAME}: render_mode must be 'text' (hybrid's models read text)")
        self.make({k: v for k, v in settings.items() if k in self.GAME_KEYS})
        self.seed = episode_seed(self.extras, self.NAME)
        self.actions = 0
        self.score = 0.0
        self.valid_actions = 0

    # -- the contract
    def init(self, prompt):
        observation = self.reset(self.seed)
        first = render(
            self.template,
            observation=observation,
            turn_idx=1,
            actions_left=self.max_actions,
            max_response_length=self.max_tokens_per_step,
        )
        messages = [
            {"role": "system", "content": self.system_template},
            {"role": "user", "content": f"{self.instructions()}\n{first}"},
        ]
        return messages, {}

    def step(self, action: str) -> StepOutput:
        parsed = parse_action(action, self.action_pattern, self.action_lookup, self.special_tokens)
        reward, done = self.play(parsed["action"])
        if parsed["action"] is None:
            reward += self.format_penalty
        else:
            self.valid_actions += 1
        self.actions += 1
        self.score += reward
        done = done or self.actions >= self.max_actions
        observations = []
        if not done:
            text = render(
                self.template,
                observation=self.render_board(),
                turn_idx=self.actions + 1,
                actions_left=self.max_actions - self.actions,
                max_response_length=self.max_tokens_per_step,
            )
            observations = [{"role": "user", "content": text}]
        return {"observations": observations, "reward": float(reward), "done": done, "metadata": parsed}

    def get_metrics(self) -> dict[str, Any]:
        return {
            "success": float(self.success()),
            "actions": self.actions,
            "action_is_valid": self.valid_actions / self.actions if self.actions else 0.0,
        }

    def instructions(self) -> str:
        vocab = ", ".join(f"{k}: {v}" for k, v in self.grid_vocab.items())
        actions = ", ".join(str(v) for v in self.action_lookup.values())
        return (
            f"{self.env_instruction}\nThe meaning of each symbol in the state is:\n{vocab}"
            f"\nYour available actions are:\n{actions}"
        )

    # -- the game (subclasses)
    def make(self, settings: dict[str, Any]) -> None:
        raise NotImplementedError

    def reset(self, seed: int) -> str:
        raise NotImplementedError

    def play(self, action: int | None) -> tuple[float, bool]:
        raise NotImplementedError

    def render_board(self) -> str:
        raise NotImplementedError

    def success(self) -> bool:
        raise NotImplementedError
