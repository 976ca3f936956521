"""The ROLL dialect: a ROLL RLVR pipeline YAML (top-level pipeline keys, and the worker
sections actor_train, actor_infer, reference, critic, validation, rewards) translated into
hybrid's verl keys.

`python -m hybrid.main_ppo --roll-config rlvr_config.yaml [key=value ...]` composes the file
with Hydra the way ROLL's launcher does (its `defaults:` list is read relative to the file,
its interpolations such as `${response_length}` resolve against it), applies the key=value
arguments as ROLL dotted keys onto it (a key the file does not have needs +key=value, as in
ROLL), then translates every leaf. `translate_roll` returns the verl overrides or raises
ConfigError naming every key that has no equivalent, with the reason.

Units that differ are transformed: ROLL's optimizer-step batch is
`per_device_train_batch_size x gradient_accumulation_steps x len(device_mapping)` samples,
verl's `ppo_mini_batch_size` is that divided by `num_return_sequences_in_group` (prompts);
ROLL's warm-up counts optimizer steps, hybrid's training steps; `sequence_length` is prompt
plus response. actor_train's `device_mapping` is the training group (its length the number of
devices), which reference and critic share; actor_infer either shares it too (colocated) or has
devices of its own (disjoint: hybrid's engines in their own actors, with the schedule of
`async_generation_ratio`: in turn at 0, streamed ahead of training above). The agentic pipeline's multi-turn
keys (custom_envs, the env managers) are in roll_agentic.py; the converters the rules call
are in roll_convert.py (devices and batch sizes in roll_placement.py), the worker sections' rules in
roll_workers.py (their strategy settings in roll_strategy.py), the rewards section's in
roll_rewards.py, the step batch (and the agentic pipeline's batch adjustment) in roll_batches.py,
the rule table in roll_rules.py (top-level keys) and roll_sections.py (the worker sections), and
roll_worker_keys.py (every other field of ROLL's worker and pipeline config classes: what ROLL
does not read for a role, ignored, with where it reads it; what would change training, refused).
"""

from __future__ import annotations

import os
import re
from typing import Any

from hybrid.dialects.roll_convert import UNSET_ENV
from hybrid.dialects.roll_placement import parse_devices
from hybrid.dialects.roll_rules import ROLL_DEFAULTS, RULES
from hybrid.dialects.table import Dialect, show, translate

DIALECT = Dialect(
    name="ROLL",
    rules=RULES,
    aliases={},
    defaults=ROLL_DEFAULTS,
    always={"trainer.merge_on_finish": False, "trainer.plot_on_finish": False},
    always_why=(
        "ROLL writes no merged folder and no plots at the end of a run; its checkpoints already hold "
        "the Hugging Face model (save_steps)"
    ),
    notes=(
        "Keys the file does not give take hybrid's defaults (hybrid/config/ppo_trainer.yaml), not ROLL's, "
        "except where one key is read together with others (the advantage settings, the clip range, the "
        "optimizer-step batch): there the missing ones take ROLL's defaults. Notably ROLL's adv_estimator "
        "defaults to gae, loss_agg_mode to seq-mean-token-mean (hybrid: token-mean), init_kl_coef to 0.2.",
        "Data files use verl's columns (prompt, data_source, reward_model.ground_truth, extra_info). With one "
        "domain, ROLL's tag column does not route rows, each row's data_source picks the scorer; with several "
        "(domain_interleave_probs), each row's domain comes from its domain column or its tag (tag_included, else "
        "math_rule), every batch is filled with ROLL's per-domain quotas and each domain's rows are scored by the "
        "scorer its worker_cls stands for (data.domain_* keys, hybrid/domains.py): math, CrossThinkQA, IFEval and "
        "the code sandbox in local mode (reward/scorers/roll_*.py); a code row's reward_model.ground_truth holds "
        "ROLL's test columns (case_type, test_cases, test_case_function) as a dict or its JSON.",
        "Multi-turn: a custom_envs section (the agentic pipeline's) sets hybrid's multi_turn section. An env "
        "manager whose environments make their task from a seed (sokoban, frozen_lake: ROLL's SimpleSokoban, "
        "LargerSokoban, SokobanDifferentGridVocab, FrozenLake) runs episodes from seeds: its num_env_groups x "
        "group_size episodes become seed rows (data files 'env-seeds:rows=R&seed=S&groups=env/tag*count', "
        "hybrid/env_seeds.py), one row per group sampled group_size times, and rollout_batch_size / "
        "val_batch_size count trajectories; otherwise the episodes start from the data file's rows, whose "
        "env_class column picks the environment where custom_envs names none (roll_agentic.py has the details).",
        "Placement: actor_train's device_mapping is the training group (trainer.nnodes x n_gpus_per_node); "
        "reference and critic must use the same one. actor_infer with the same mapping is colocated (hybrid's "
        "fused engine), and so is one on part of actor_train's devices with async_generation_ratio=0 (the engines "
        "then run on all of actor_train's devices: the same generation on more engines); "
        "with a disjoint one its devices become rollout.nnodes x n_gpus_per_node "
        "(actor_rollout_ref.hybrid_engine=false) and async_generation_ratio picks the schedule: 0 generates and "
        "trains in turn (one_step_off at lag 0), r >= 1 streams prompt groups r steps ahead (fully_async, "
        "staleness bound ceil(r), weights pushed every step).",
    ),
)


def translate_roll(path: str, overrides: list[str]) -> list[str]:
    """A ROLL pipeline YAML plus ROLL dotted `key=value` overrides -> verl overrides
    (`hydra.*` overrides pass through unchanged). Raises ConfigError listing every problem."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from hybrid.config import ConfigError

    full = os.path.abspath(path)
    if not os.path.isfile(full):
        raise ConfigError(f"--roll-config {path}: no such file (working directory {os.getcwd()})")
    passthrough = [o for o in overrides if o.lstrip("+~").startswith(("hydra.", "hydra/"))]
    roll_overrides = [o for o in overrides if o not in passthrough]
    name = os.path.splitext(os.path.basename(full))[0]
    try:
        with initialize_config_dir(config_dir=os.path.dirname(full), version_base=None):
            cfg = compose(config_name=name, overrides=roll_overrides)
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError(f"--roll-config {path}: ROLL's file or overrides cannot be composed: {err}") from err

    problems, given = [], {}
    leaves = list(_leaves(OmegaConf.to_container(cfg, resolve=False)))
    variables = _variables(leaves)
    for key, raw in leaves:
        if key.split(".", 1)[0] in variables and DIALECT.rule_for(key) is None:
            continue  # a YAML variable: the keys that read it through ${...} are translated
        try:
            value = OmegaConf.select(cfg, key, throw_on_missing=True)
            value = OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
            if isinstance(value, dict) and value:
                given.update(_leaves(value, key))  # a whole section through ${...} (custom_envs.<tag>)
            else:
                given[key] = value
        except OmegaConfBaseException as err:
            rule = DIALECT.rule_for(key)
            if rule is not None and rule.kind == "ignore":
                continue
            if key.startswith("tracker_kwargs.") and isinstance(raw, str) and UNSET_ENV.fullmatch(raw):
                given[key] = raw  # an api key from a variable set only where the run logs (roll_convert._tracker)
                continue
            problems.append(
                f"{key}={show(raw)}: cannot resolve the value ({type(err).__name__}: {err})".replace("\n", " ")
            )
    if problems:
        raise ConfigError("\n".join([f"--roll-config {path} cannot be read:"] + [f"  - {p}" for p in problems]))
    return translate(DIALECT, given) + passthrough


_REFERENCE = re.compile(r"\$\{([A-Za-z_][\w]*)[.}\[]")


def _variables(leaves: list[tuple[str, Any]]) -> set[str]:
    """Top-level names that values read through ${name...}: ROLL's example files keep settings and
    whole environment sections there (examples/config/traj_envs.yaml's custom_env, max_steps...)
    for custom_envs to pick up; ROLL's launcher drops those names unread (they are no config
    field), so they are not translated themselves."""
    sections = {rule.key.split(".", 1)[0] for rule in DIALECT.rules}  # ROLL's own: a typo there is reported
    return {name for _, raw in leaves if isinstance(raw, str) for name in _REFERENCE.findall(raw)} - sections


def _leaves(tree: Any, prefix: str = ""):
    """(dotted key, unresolved value) for every leaf; a whole-dict interpolation is a leaf."""
    for name, value in tree.items():
        key = f"{prefix}.{name}" if prefix else str(name)
        if isinstance(value, dict) and value:
            yield from _leaves(value, key)
        else:
            yield key, value


__all__ = ["DIALECT", "RULES", "parse_devices", "translate_roll"]
