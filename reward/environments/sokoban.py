"""`sokoban`: ROLL's Sokoban (roll/pipeline/agentic/env/sokoban/env.py, on gym-sokoban's rules),
written with numpy only; ROLL's SimpleSokoban, LargerSokoban and SokobanDifferentGridVocab are
this environment with other settings.

Board: 0 wall, 1 empty, 2 target, 3 box on target, 4 box, 5 player (6, player on a target, only
when rendered). A room is made from the episode's seed as gym-sokoban makes it: a random walk
carves the floor, the player and `num_boxes` boxes are placed on targets, then the game is
played backwards (the player pulls boxes) by a depth-first search of `search_depth` moves, and
the state whose boxes were moved farthest (box swaps x displacement) is the start; a few random
player steps follow. So every room is solvable. A failed room is made again from the same
random stream (ROLL re-seeds with Python's per-process string hash, which is not repeatable).

Actions 1 Up, 2 Down, 3 Left, 4 Right push a box when one is ahead and the cell behind it is
free, else move onto a free cell. Each action costs -0.1; a box pushed onto a target +1, off one
-1; all boxes on targets +10 and the episode ends, as it does after `max_steps` actions. A turn
without a valid action is a no-op action (its -0.1) plus `format_penalty`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from reward.environments.grid_game import GridGameEnv, int_keys
from reward.environments.registry import register_env

WALL, EMPTY, TARGET, BOX_ON_TARGET, BOX, PLAYER = range(6)
MOVES = {1: (-1, 0), 2: (1, 0), 3: (0, -1), 4: (0, 1)}
STEP_PENALTY, BOX_ON_REWARD, BOX_OFF_PENALTY, FINISHED_REWARD = -0.1, 1.0, -1.0, 10.0
GRID_LOOKUP = {0: "#", 1: "_", 2: "O", 3: "√", 4: "X", 5: "P", 6: "S"}
GRID_VOCAB = {
    "#": "wall",
    "_": "empty",
    "O": "target",
    "√": "box on target",
    "X": "box",
    "P": "player",
    "S": "player on target",
}
ACTION_LOOKUP = {1: "Up", 2: "Down", 3: "Left", 4: "Right"}
INSTRUCTION = (
    "You are solving the Sokoban puzzle. You are the player and you need to push all boxes to targets. "
    "When you are right next to a box, you can push it by moving in the same direction. "
    "You cannot push a box through a wall, and you cannot pull a box. "
    "The answer must be one of action in a turn, format is <answer>Right</answer>."
)
MASKS = np.array(
    [
        [[0, 0, 0], [1, 1, 1], [0, 0, 0]],
        [[0, 1, 0], [0, 1, 0], [0, 1, 0]],
        [[0, 0, 0], [1, 1, 0], [0, 1, 0]],
        [[0, 0, 0], [1, 1, 0], [1, 1, 0]],
        [[0, 0, 0], [0, 1, 1], [0, 1, 0]],
    ]
)


def _topology(dim: tuple[int, int], steps: int, rng: np.random.Generator) -> np.ndarray:
    """Floor carved by a random walk that stamps a random 3x3 mask at each position."""
    rows, cols = dim
    directions = [(1, 0), (0, 1), (-1, 0), (0, -1)]
    direction = directions[rng.integers(4)]
    position = np.array([rng.integers(1, rows), rng.integers(1, cols)])
    level = np.zeros(dim, dtype=int)
    for _ in range(steps):
        if rng.random() < 0.35:
            direction = directions[rng.integers(4)]
        position = np.clip(position + direction, 1, [rows - 2, cols - 2])
        level[position[0] - 1 : position[0] + 2, position[1] - 1 : position[1] + 2] += MASKS[rng.integers(len(MASKS))]
    level = (level > 0).astype(int)
    level[:, [0, cols - 1]] = WALL
    level[[0, rows - 1], :] = WALL
    return level


class _ReversePlay:
    """Pull boxes away from their targets; keeps the best state seen (gym-sokoban's search)."""

    def __init__(self, fixed: np.ndarray, num_boxes: int):
        self.fixed, self.num_boxes = fixed, num_boxes
        self.seen: set[bytes] = set()
        self.best_score, self.best = -1, None

    def search(self, state: np.ndarray, boxes: dict, swaps: int, last_pull, ttl: int) -> None:
        ttl -= 1
        if ttl <= 0 or len(self.seen) >= 300000:
            return
        key = state.tobytes()
        if key in self.seen:
            return
        self.seen.add(key)
        score = swaps * _displacement(boxes) if (state == TARGET).sum() == self.num_boxes else 0
        if score > self.best_score:
            self.best_score, self.best = score, (state.copy(), dict(boxes))
        for move in MOVES.values():
            nxt, nboxes, pulled = self._pull(state.copy(), dict(boxes), last_pull, move)
            self.search(nxt, nboxes, swaps + (pulled != last_pull), pulled, ttl)

    def _pull(self, state, boxes, last_pull, move):
        player = np.argwhere(state == PLAYER)[0]
        ahead = player + move
        if state[tuple(ahead)] not in (EMPTY, TARGET):
            return state, boxes, last_pull
        state[tuple(player)], state[tuple(ahead)] = self.fixed[tuple(player)], PLAYER
        behind = tuple(player - move)
        if state[behind] in (BOX_ON_TARGET, BOX):
            state[tuple(player)], state[behind] = BOX_ON_TARGET, self.fixed[behind]
            for origin, at in boxes.items():
                if at == behind:
                    boxes[origin], last_pull = tuple(player), origin
        return state, boxes, last_pull


def _displacement(boxes: dict) -> int:
    return int(sum(abs(a[0] - b[0]) + abs(a[1] - b[1]) for a, b in boxes.items()))


def _random_walk(state: np.ndarray, fixed: np.ndarray, rng: np.random.Generator, probability: float) -> None:
    """Up to 3 random player steps onto free cells not visited before (ROLL's add_random_player_movement)."""
    if rng.random() > probability:
        return
    player = np.argwhere(state == PLAYER)[0]
    visited = [tuple(player)]
    for taken in range(1, 4):
        options = [player + m for m in MOVES.values() if state[tuple(player + m)] in (EMPTY, TARGET)]
        options = [p for p in options if tuple(p) not in visited]
        if not options:
            return
        nxt = options[rng.integers(len(options))]
        state[tuple(player)], state[tuple(nxt)] = fixed[tuple(player)], PLAYER
        player = nxt
        visited.append(tuple(player))
        if taken >= 3 or rng.random() > 0.5:
            return


def generate_room(dim, num_boxes: int, search_depth: int, rng: np.random.Generator, steps: int | None = None):
    """(fixed, state): a solvable room; RuntimeError when `tries` rooms all failed."""
    steps = int(1.7 * (dim[0] + dim[1])) if steps is None else steps
    for _ in range(100):
        room = _topology(tuple(dim), steps, rng)
        free = np.argwhere(room == EMPTY)
        if len(free) <= num_boxes + 1:
            continue
        picks = rng.choice(len(free), size=num_boxes + 1, replace=False)
        fixed = room.copy()
        for cell in free[picks[1:]]:
            fixed[tuple(cell)] = TARGET
        state = fixed.copy()
        state[tuple(free[picks[0]])] = PLAYER
        state[fixed == TARGET] = BOX_ON_TARGET
        search = _ReversePlay(fixed, num_boxes)
        search.search(state, {tuple(c): tuple(c) for c in free[picks[1:]]}, 0, (-1, -1), search_depth)
        best, boxes = search.best
        if _displacement(boxes) == 0:
            continue
        best[best == BOX_ON_TARGET] = BOX  # a box the search left on its target is drawn as ROLL does
        _random_walk(best, fixed, rng, 0.8 if _displacement(boxes) == 1 else 0.5)
        return fixed, best
    raise RuntimeError(f"sokoban: no room of size {list(dim)} with {num_boxes} boxes in 100 tries")


@register_env("sokoban")
class SokobanEnv(GridGameEnv):
    NAME = "sokoban"
    GAME_KEYS = (
        "dim_room",
        "num_boxes",
        "max_steps",
        "search_depth",
        "grid_lookup",
        "grid_vocab",
        "action_lookup",
        "env_instruction",
        "format_penalty",
        "action_pattern",
        "special_token_list",
        "render_mode",
        "num_gen_steps",
    )

    def make(self, settings: dict[str, Any]) -> None:
        self.dim_room = tuple(int(x) for x in settings.get("dim_room", (10, 10)))
        self.num_boxes = int(settings.get("num_boxes", 4))
        self.max_steps = int(settings.get("max_steps", 20))
        self.search_depth = int(settings.get("search_depth", 300))
        self.num_gen_steps = settings.get("num_gen_steps")
        self.grid_lookup = int_keys(settings.get("grid_lookup")) or GRID_LOOKUP
        self.grid_vocab = dict(settings.get("grid_vocab") or GRID_VOCAB)
        self.action_lookup = int_keys(settings.get("action_lookup")) or ACTION_LOOKUP
        self.env_instruction = settings.get("env_instruction") or INSTRUCTION

    def reset(self, seed: int) -> str:
        self.fixed, self.state = generate_room(
            self.dim_room, self.num_boxes, self.search_depth, np.random.default_rng(seed), self.num_gen_steps
        )
        self.steps, self.boxes_on_target = 0, 0
        return self.render_board()

    def set_board(self, fixed: np.ndarray, state: np.ndarray) -> None:
        """Play a given board (tests, hand-made puzzles)."""
        self.fixed, self.state = np.array(fixed), np.array(state)
        self.steps, self.boxes_on_target = 0, int((self.state == BOX_ON_TARGET).sum())

    def play(self, action: int | None) -> tuple[float, bool]:
        self.steps += 1
        if action is not None:
            self._push_or_move(MOVES[action])
        reward = STEP_PENALTY
        on_target = int((self.state == BOX_ON_TARGET).sum())
        if on_target > self.boxes_on_target:
            reward += BOX_ON_REWARD
        elif on_target < self.boxes_on_target:
            reward += BOX_OFF_PENALTY
        won = self.success()
        if won:
            reward += FINISHED_REWARD
        self.boxes_on_target = on_target
        return reward, won or self.steps >= self.max_steps

    def _push_or_move(self, move) -> None:
        player = np.argwhere(self.state == PLAYER)[0]
        ahead, beyond = player + move, player + 2 * np.array(move)
        inside = 0 <= beyond[0] < self.state.shape[0] and 0 <= beyond[1] < self.state.shape[1]
        if inside and self.state[tuple(ahead)] in (BOX, BOX_ON_TARGET) and self.state[tuple(beyond)] in (EMPTY, TARGET):
            self.state[tuple(beyond)] = BOX_ON_TARGET if self.fixed[tuple(beyond)] == TARGET else BOX
        elif self.state[tuple(ahead)] not in (EMPTY, TARGET):
            return
        self.state[tuple(player)], self.state[tuple(ahead)] = self.fixed[tuple(player)], PLAYER

    def success(self) -> bool:
        # no target left uncovered by a box (the player standing on one leaves it uncovered)
        return not ((self.state == TARGET) | ((self.fixed == TARGET) & (self.state == PLAYER))).any()

    def render_board(self) -> str:
        room = np.where((self.state == PLAYER) & (self.fixed == TARGET), 6, self.state)
        return "\n".join("".join(self.grid_lookup.get(int(c), "?") for c in row) for row in room)
