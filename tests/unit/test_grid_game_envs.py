"""ROLL's grid games as hybrid environments (reward/environments/sokoban.py, frozen_lake.py,
grid_game.py): seeded boards are repeatable and solvable, moves, pushes, rewards and the end of
an episode follow gym-sokoban's / gymnasium's rules on hand-made boards, actions are parsed as
ROLL parses them, and the turns are rendered with ROLL's templates."""

from __future__ import annotations

from collections import deque

import numpy as np
import pytest

from reward.environments import get_env_cls
from reward.environments.grid_game import parse_action

SOKOBAN = get_env_cls("sokoban")
FROZEN = get_env_cls("frozen_lake")
LOOKUP = {1: "Up", 2: "Down", 3: "Left", 4: "Right"}


def answer(name: str) -> str:
    return f"<answer>{name}</answer>"


def solvable(fixed: np.ndarray, state: np.ndarray, limit: int = 200000) -> bool:
    """Breadth-first search over (player, boxes): an independent check that a room can be won."""
    free = fixed != 0
    targets = {tuple(c) for c in np.argwhere(fixed == 2)}
    start = (tuple(np.argwhere(state == 5)[0]), frozenset(tuple(c) for c in np.argwhere((state == 3) | (state == 4))))
    queue, seen = deque([start]), {start}
    while queue and len(seen) < limit:
        player, boxes = queue.popleft()
        if boxes == targets:
            return True
        for dr, dc in ((-1, 0), (1, 0), (0, -1), (0, 1)):
            ahead = (player[0] + dr, player[1] + dc)
            if not free[ahead]:
                continue
            new_boxes = boxes
            if ahead in boxes:
                beyond = (ahead[0] + dr, ahead[1] + dc)
                if not free[beyond] or beyond in boxes:
                    continue
                new_boxes = (boxes - {ahead}) | {beyond}
            node = (ahead, new_boxes)
            if node not in seen:
                seen.add(node)
                queue.append(node)
    return False


@pytest.mark.parametrize(
    "config",
    [
        {"dim_room": [6, 6], "num_boxes": 1},
        {"dim_room": [6, 6], "num_boxes": 1, "search_depth": 30},
        {"dim_room": [10, 10], "num_boxes": 2, "search_depth": 10},
    ],
)
def test_seeded_rooms_are_repeatable_and_solvable(config):
    boards = set()
    for seed in range(6):
        env = SOKOBAN(env_config=config, extras={"seed": seed})
        env.init(None)
        again = SOKOBAN(env_config=config, extras={"seed": seed})
        again.init(None)
        assert np.array_equal(env.state, again.state) and np.array_equal(env.fixed, again.fixed)
        assert env.state.shape == tuple(config["dim_room"])
        assert (env.fixed == 2).sum() == config["num_boxes"] == ((env.state == 3) | (env.state == 4)).sum()
        assert not env.success()  # the boxes were pulled off their targets
        assert solvable(env.fixed, env.state)
        boards.add(env.state.tobytes())
    assert len(boards) > 1  # other seeds, other rooms


# A corridor: wall, player, box, empty, target, wall.
FIXED = np.array([[0] * 7, [0, 1, 1, 1, 2, 1, 0], [0] * 7])
STATE = np.array([[0] * 7, [0, 5, 4, 1, 2, 1, 0], [0] * 7])


def corridor(**settings):
    env = SOKOBAN(env_config={"dim_room": [3, 7], "num_boxes": 1, **settings}, extras={"seed": 0})
    env.set_board(FIXED.copy(), STATE.copy())
    return env


def test_sokoban_push_rewards_and_done():
    env = corridor(max_steps=20)
    out = env.step(answer("right"))  # box to column 3
    assert out["reward"] == pytest.approx(-0.1) and not out["done"]
    assert env.state[1].tolist() == [0, 1, 5, 4, 2, 1, 0]
    out = env.step(answer("Right"))  # box onto the target: -0.1 + 1 + 10, won
    assert out["reward"] == pytest.approx(10.9) and out["done"] and env.success()
    assert env.state[1].tolist() == [0, 1, 1, 5, 3, 1, 0]


def test_sokoban_box_off_target_and_blocked_moves():
    env = corridor(max_steps=20)
    env.set_board(FIXED.copy(), np.array([[0] * 7, [0, 1, 1, 5, 3, 1, 0], [0] * 7]))
    out = env.step(answer("Right"))  # box off the target onto the empty cell: -0.1 - 1
    assert out["reward"] == pytest.approx(-1.1) and not out["done"]
    assert env.state[1].tolist() == [0, 1, 1, 1, 6 - 1, 4, 0]  # player on the target (5 in the state)
    assert env.render_board().splitlines()[1] == "#___SX#"
    out = env.step(answer("Right"))  # box against the wall: no push, no move
    assert out["reward"] == pytest.approx(-0.1) and env.state[1].tolist() == [0, 1, 1, 1, 5, 4, 0]
    out = env.step(answer("Up"))  # a wall
    assert out["reward"] == pytest.approx(-0.1) and env.state[1].tolist() == [0, 1, 1, 1, 5, 4, 0]


def test_sokoban_invalid_action_is_a_noop_step_plus_format_penalty_and_max_steps_end():
    env = corridor(max_steps=2, format_penalty=-0.15)
    out = env.step("I go right")
    assert out["reward"] == pytest.approx(-0.25) and not out["done"]
    assert out["metadata"]["action"] is None and env.state[1].tolist() == STATE[1].tolist()
    out = env.step(answer("Left"))  # the second action: the game's max_steps ends it
    assert out["reward"] == pytest.approx(-0.1) and out["done"] and out["observations"] == []


def test_episode_ends_after_max_actions_and_renders_roll_templates():
    template = "Turn {turn_idx}:\n{observation}\nYou have {actions_left} actions left, {max_response_length} tokens."
    env = corridor(
        max_steps=20, max_actions=2, max_tokens_per_step=64, agent_system_template="SYS", agent_template=template
    )
    env.reset = lambda seed: (env.set_board(FIXED.copy(), STATE.copy()), env.render_board())[1]
    messages, _ = env.init([{"role": "user", "content": "the row's placeholder"}])
    board = "#######\n#PX_O_#\n#######"
    assert messages[0] == {"role": "system", "content": "SYS"}
    assert messages[1]["content"].startswith("You are solving the Sokoban puzzle.")
    assert messages[1]["content"].endswith(
        f"Up, Down, Left, Right\nTurn 1:\n{board}\nYou have 2 actions left, 64 tokens."
    )
    out = env.step(answer("Left"))  # against the wall
    assert out["observations"] == [
        {"role": "user", "content": f"Turn 2:\n{board}\nYou have 1 actions left, 64 tokens."}
    ]
    out = env.step(answer("Left"))
    assert out["done"] and out["observations"] == []


def test_other_grid_vocabulary_and_tag_sections():
    lookup = {0: "W", 1: ".", 2: "G", 3: "C", 4: "B", 5: "A", 6: "@"}
    config = {"tags": {"Vocab": {"dim_room": [3, 7], "grid_lookup": {str(k): v for k, v in lookup.items()}}}}
    env = SOKOBAN(env_config=config, extras={"seed": 1, "tag": "Vocab"})
    env.set_board(FIXED.copy(), STATE.copy())
    assert env.render_board().splitlines()[1] == "WAB.G.W"
    with pytest.raises(ValueError, match="the row's tag 'Other' has no section in multi_turn.env_kwargs.tags"):
        SOKOBAN(env_config=config, extras={"seed": 1, "tag": "Other"})
    with pytest.raises(ValueError, match="sokoban: the row needs an integer 'seed' column"):
        SOKOBAN(env_config={}, extras={})
    with pytest.raises(ValueError, match=r"sokoban: unknown settings \['dim'\]"):
        SOKOBAN(env_config={"dim": 3}, extras={"seed": 0})


def test_parse_action_as_roll():
    assert parse_action("<answer> up </answer><|im_end|>", r"<answer>(.*?)</answer>", LOOKUP)["action"] == 1
    assert parse_action("<answer>Jump</answer>", r"<answer>(.*?)</answer>", LOOKUP)["action"] is None
    assert parse_action("Right", r"<answer>(.*?)</answer>", LOOKUP)["action"] is None
    think = parse_action(
        "<think>go down</think> <answer>Down</answer>", r"<think>(.*?)</think>\s*<answer>(.*?)</answer>", LOOKUP
    )
    assert think == {"action": 2, "action_content": "Down", "think_content": "go down"}
    # the first match counts
    assert parse_action("<answer>Left</answer><answer>Up</answer>", r"<answer>(.*?)</answer>", LOOKUP)["action"] == 3


def lake(**settings):
    env = FROZEN(env_config={"is_slippery": False, "format_penalty": -0.01, **settings}, extras={"seed": 5})
    env.set_map(["SFH", "FFF", "HFG"])
    return env


def test_frozen_lake_moves_goal_and_hole():
    env = lake()
    assert env.render_board() == "P_O\n___\nO_G"
    out = env.step(answer("Left"))  # the edge: no move
    assert (out["reward"], out["done"], env.player) == (0.0, False, (0, 0))
    assert env.step(answer("Down"))["reward"] == 0.0 and env.player == (1, 0)
    assert env.step(answer("Right"))["reward"] == 0.0 and env.player == (1, 1)
    env.step(answer("Right"))
    out = env.step(answer("Down"))
    assert (out["reward"], out["done"]) == (1.0, True) and env.render_board() == "__O\n___\nO_√"
    env = lake()
    out = env.step(answer("Right"))
    out = env.step(answer("Right"))  # into the hole
    assert (out["reward"], out["done"]) == (0.0, True) and env.render_board() == "__X\n___\nO_G"


def test_frozen_lake_invalid_action_scores_the_format_penalty_only():
    env = lake()
    out = env.step("<answer>Fly</answer>")
    assert (out["reward"], out["done"], env.player) == (-0.01, False, (0, 0))


def test_frozen_lake_seeded_maps_have_a_path():
    for seed in range(10):
        env = FROZEN(env_config={"size": 4, "p": 0.8, "is_slippery": False}, extras={"seed": seed})
        env.init(None)
        again = FROZEN(env_config={"size": 4, "p": 0.8, "is_slippery": False}, extras={"seed": seed})
        again.init(None)
        assert (env.desc == again.desc).all() and (env.desc == "S").sum() == 1 and (env.desc == "G").sum() == 1
        # breadth-first search over non-hole cells
        start, goal = tuple(np.argwhere(env.desc == "S")[0]), tuple(np.argwhere(env.desc == "G")[0])
        queue, seen = deque([start]), {start}
        while queue:
            r, c = queue.popleft()
            for dr, dc in ((0, 1), (1, 0), (0, -1), (-1, 0)):
                nxt = (r + dr, c + dc)
                if 0 <= nxt[0] < 4 and 0 <= nxt[1] < 4 and env.desc[nxt] != "H" and nxt not in seen:
                    seen.add(nxt)
                    queue.append(nxt)
        assert goal in seen
