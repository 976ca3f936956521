"""`frozen_lake`: ROLL's FrozenLake (roll/pipeline/agentic/env/frozen_lake/env.py, on gymnasium's
FrozenLake rules), written with numpy only; ROLL's FrozenLake and FrozenLakeThink are this
environment with other settings.

The map is made from the episode's seed: a `size` x `size` grid of frozen cells (probability
`p`) and holes, a random start and a different random goal, drawn again until a path of
non-hole cells joins them. Actions 0 Left, 1 Down, 2 Right, 3 Up move one cell (not past the
edge); with `is_slippery` the move goes in the intended direction or either side of it, 1/3
each. Stepping on the goal scores 1 and ends the episode; a hole ends it with 0; every other
step scores 0. A turn without a valid action does not move and scores `format_penalty`.
Rendered: P player, _ frozen, O hole, G goal, X player in a hole, √ player on the goal.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from reward.environments.grid_game import GridGameEnv, int_keys
from reward.environments.registry import register_env

GRID_LOOKUP = {0: "P", 1: "_", 2: "O", 3: "G", 4: "X", 5: "√"}
GRID_VOCAB = {"P": "player", "_": "empty", "O": "hole", "G": "goal", "X": "player in hole", "√": "player on goal"}
ACTION_LOOKUP = {0: "Left", 1: "Down", 2: "Right", 3: "Up"}
MOVES = {0: (0, -1), 1: (1, 0), 2: (0, 1), 3: (-1, 0)}
CELL_CODE = {"F": 1, "H": 2, "G": 3, "S": 1}
INSTRUCTION = (
    "You are solving the FrozenLake puzzle. Forbid the whole and go to the target. "
    "You may move to the unintended direction due to the slippery ice. "
    "The answer must be one of action in a turn, format is <answer>Right</answer>"
)


def _joined(board: np.ndarray) -> bool:
    """Whether a path of non-hole cells leads from S to G."""
    size = board.shape[0]
    frontier, seen = [tuple(np.argwhere(board == "S")[0])], set()
    while frontier:
        r, c = frontier.pop()
        if (r, c) in seen:
            continue
        seen.add((r, c))
        for dr, dc in MOVES.values():
            nr, nc = r + dr, c + dc
            if 0 <= nr < size and 0 <= nc < size:
                if board[nr, nc] == "G":
                    return True
                if board[nr, nc] != "H":
                    frontier.append((nr, nc))
    return False


def generate_map(size: int, p: float, rng: np.random.Generator) -> list[str]:
    """Rows of 'S', 'F', 'H', 'G' with a path from S to G (ROLL's generate_random_map)."""
    while True:
        board = rng.choice(np.array(["F", "H"]), (size, size), p=[p, 1 - p])
        start, goal = tuple(rng.integers(size, size=2)), tuple(rng.integers(size, size=2))
        if start != goal:
            board[start], board[goal] = "S", "G"
            if _joined(board):
                return ["".join(row) for row in board]


@register_env("frozen_lake")
class FrozenLakeEnv(GridGameEnv):
    NAME = "frozen_lake"
    GAME_KEYS = (
        "size",
        "p",
        "is_slippery",
        "map_seed",
        "max_steps",
        "grid_lookup",
        "grid_vocab",
        "action_lookup",
        "env_instruction",
        "format_penalty",
        "action_pattern",
        "special_token_list",
        "render_mode",
    )

    def make(self, settings: dict[str, Any]) -> None:
        self.size = int(settings.get("size", 4))
        self.p = float(settings.get("p", 0.8))
        self.is_slippery = bool(settings.get("is_slippery", True))
        # max_steps: ROLL's FrozenLake only reads it to label a time-out; the episode's limit is max_actions
        self.grid_lookup = int_keys(settings.get("grid_lookup")) or GRID_LOOKUP
        self.grid_vocab = dict(settings.get("grid_vocab") or GRID_VOCAB)
        self.action_lookup = int_keys(settings.get("action_lookup")) or ACTION_LOOKUP
        self.env_instruction = settings.get("env_instruction") or INSTRUCTION

    def reset(self, seed: int) -> str:
        self.rng = np.random.default_rng(seed)
        self.set_map(generate_map(self.size, self.p, self.rng))
        return self.render_board()

    def set_map(self, rows: list[str]) -> None:
        """Play a given map (tests, hand-made puzzles)."""
        self.desc = np.array([list(row) for row in rows])
        self.player = tuple(int(x) for x in np.argwhere(self.desc == "S")[0])

    def play(self, action: int | None) -> tuple[float, bool]:
        if action is None:
            return 0.0, False
        if self.is_slippery:
            action = (action + int(self.rng.integers(3)) - 1) % 4
        dr, dc = MOVES[action]
        last = self.desc.shape[0] - 1
        self.player = (min(max(self.player[0] + dr, 0), last), min(max(self.player[1] + dc, 0), last))
        cell = self.desc[self.player]
        return (1.0 if cell == "G" else 0.0), bool(cell in ("G", "H"))

    def success(self) -> bool:
        return bool(self.desc[self.player] == "G")

    def render_board(self) -> str:
        codes = np.vectorize(CELL_CODE.get)(self.desc)
        cell = self.desc[self.player]
        codes[self.player] = 4 if cell == "H" else 5 if cell == "G" else 0
        return "\n".join("".join(self.grid_lookup.get(int(c), "?") for c in row) for row in codes)
