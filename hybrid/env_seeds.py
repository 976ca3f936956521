"""Episodes that come from seeds, not from a data file: ROLL's environment-driven rollout as
dataset rows.

In ROLL's agentic pipeline each episode's task comes from `env.reset(seed)`; its env manager
runs `num_env_groups` groups of `group_size` environments, the groups split between the
environment sections (`tags`) by `num_groups_partition`, every environment of a group with the
same settings and seed. hybrid's episodes start from dataset rows, each row sampled
`rollout.n` times, so one group is one row with rollout.n = group_size. Such a dataset is named
by a spec instead of a file (data.train_files / data.val_files), which the data loader and the
preflight read as rows:

    env-seeds:rows=32&seed=42&groups=sokoban/SimpleSokoban*16,frozen_lake/FrozenLake*16

`rows` rows; row i belongs to group i mod (sum of the counts), the groups taken in order by the
`env/tag*count` entries; its seed is the i-th draw of a generator seeded with `seed` (ROLL draws
a random seed per group and episode). A row is `{prompt, data_source: tag, env_class: env,
tag, seed, reward_model: {ground_truth: None}, extra_info: {index, tag, seed}}`; its prompt is a
placeholder the environment replaces with the rendered board (reward/environments/grid_game.py),
its tag picks the settings in multi_turn.env_kwargs.tags.<tag>.
"""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode

import numpy as np

PREFIX = "env-seeds:"


def is_spec(path) -> bool:
    return isinstance(path, str) and path.startswith(PREFIX)


def make_spec(groups: list[tuple[str, str, int]], rows: int, seed: int) -> str:
    """The spec of `rows` rows over groups [(env_class, tag, number of groups), ...]."""
    entries = ",".join(f"{env}/{tag}*{count}" for env, tag, count in groups)
    return PREFIX + urlencode({"rows": rows, "seed": seed, "groups": entries}, safe="/*,")


def parse_spec(spec: str) -> tuple[list[tuple[str, str, int]], int, int]:
    """(groups, rows, seed) of a spec; ValueError naming what is wrong."""
    fields = dict(parse_qsl(spec[len(PREFIX) :], strict_parsing=True))
    try:
        rows, seed = int(fields["rows"]), int(fields["seed"])
        groups = []
        for entry in fields["groups"].split(","):
            name, _, count = entry.rpartition("*")
            env, _, tag = name.partition("/")
            if not env or not tag:
                raise ValueError(f"group {entry!r} is not env/tag*count")
            groups.append((env, tag, int(count)))
    except (KeyError, ValueError) as err:
        raise ValueError(f"data spec {spec!r}: {err} (format: {PREFIX}rows=N&seed=S&groups=env/tag*count,...)") from err
    if rows < 1 or not groups or any(count < 1 for _, _, count in groups):
        raise ValueError(f"data spec {spec!r}: needs rows >= 1 and at least one group with count >= 1")
    return groups, rows, seed


def spec_rows(spec: str) -> list[dict]:
    """The rows a spec names."""
    groups, rows, seed = parse_spec(spec)
    owners = [(env, tag) for env, tag, count in groups for _ in range(count)]
    seeds = np.random.default_rng(seed).integers(0, 2**31 - 1, size=rows)
    out = []
    for i in range(rows):
        env, tag = owners[i % len(owners)]
        row_seed = int(seeds[i])
        out.append(
            {
                "prompt": [{"role": "user", "content": f"{tag}, board {row_seed}"}],
                "data_source": tag,
                "env_class": env,
                "tag": tag,
                "seed": row_seed,
                "reward_model": {"style": "environment", "ground_truth": None},
                "extra_info": {"index": i, "tag": tag, "seed": row_seed},
            }
        )
    return out
