"""Checks of a run's inputs before anything loads: the mistakes the files themselves can
show, found in seconds instead of after a model and an engine have started.

`check_inputs(config)` looks at what the typed config names and raises `InputError` (exit
status 2) listing every problem it finds, each naming the key and the file:

- model and tokenizer folders (actor, reference, critic, reward model) exist and hold a
  config, weights and tokenizer files; a Hugging Face repo id must be in the local cache; a
  reference model of its own (a distillation teacher) uses the actor's tokenizer;
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

import json
import os
import re
from collections import Counter

from hybrid.defaults import DEFAULT_ASSET_PREFIX
from hybrid.env_seeds import is_spec
from hybrid.errors import InputError
from hybrid.tracking import missing_logger_packages

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
WEIGHT_SUFFIXES = (".safetensors", ".bin")
DATA_SUFFIXES = (".parquet", ".jsonl", ".json")
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
# Errors a user's reward or environment file raises while loading: reported, with the cause.
LOAD_ERRORS = (OSError, ImportError, AttributeError, TypeError, ValueError, SyntaxError)


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
    if found.problems:
        raise InputError(found.problems, found.causes)


def _placeholder(path) -> bool:
    return isinstance(path, str) and path.startswith(DEFAULT_ASSET_PREFIX)


def _shown(path: str) -> str:
    """`path` as the user wrote it, with where a relative one points."""
    full = os.path.abspath(os.path.expanduser(path))
    return repr(path) if full == path else f"{path!r} (resolved to {full}, working directory {os.getcwd()})"


# ----------------------------------------------------------------------------- models


def _model_uses(config) -> dict[str, tuple[list[str], set[str]]]:
    """path -> (the keys naming it, what must be there: 'model' and/or 'tokenizer')."""
    arr = config.actor_rollout_ref
    uses: list[tuple[str, str | None, set[str]]] = [
        (
            "actor_rollout_ref.model.path",
            arr.model.path,
            {"model"} | ({"tokenizer"} if not arr.model.tokenizer_path else set()),
        ),
        ("actor_rollout_ref.model.tokenizer_path", arr.model.tokenizer_path, {"tokenizer"}),
    ]
    teacher = _reference_model(config)
    if teacher:
        uses.append(("actor_rollout_ref.ref.model.path", teacher, {"model"}))
    if config.use_critic:
        critic = config.critic.model
        uses.append(
            ("critic.model.path", critic.path, {"model"} | ({"tokenizer"} if not critic.tokenizer_path else set()))
        )
        uses.append(("critic.model.tokenizer_path", critic.tokenizer_path, {"tokenizer"}))
    # A judge behind reward_model.judge.base_url is a name on that server, not a folder here.
    if config.reward_model.enable and not (config.reward_model.use_reward_loop and config.reward_model.judge.base_url):
        rm = config.reward_model.model
        uses.append(("reward_model.model.path", rm.path, {"model", "tokenizer"}))
        uses.append(("reward_model.model.input_tokenizer", rm.input_tokenizer, {"tokenizer"}))
    by_path: dict[str, tuple[list[str], set[str]]] = {}
    for key, path, needs in uses:
        if not path or _placeholder(path):
            continue
        keys, wanted = by_path.setdefault(str(path), ([], set()))
        keys.append(key)
        wanted |= needs
    return by_path


def _reference_model(config) -> str | None:
    """The reference model's own folder, when one is loaded and it is not the actor's."""
    arr = config.actor_rollout_ref
    path = arr.ref.model.path
    return path if config.use_reference_policy and path and path != arr.model.path else None


def check_model_folders(config, found: Findings) -> None:
    for path, (keys, needs) in _model_uses(config).items():
        problem = model_folder_problem(path, needs)
        if problem:
            also = f" (also {', '.join(keys[1:])})" if len(keys) > 1 else ""
            found.add(f"{keys[0]}{also}: {problem}")


def check_model_settings(config, found: Findings) -> None:
    """Settings the model's config.json can refuse before it loads: the fused output layer
    insisted on for a model that transforms its logits, more sequence-parallel ranks than
    attention heads, a reference model (a distillation teacher) with another vocabulary."""
    from workers.response_head import logit_transform

    arr = config.actor_rollout_ref
    models = [("actor_rollout_ref", arr.model.path, arr.actor.ulysses_sequence_parallel_size)]
    teacher = _reference_model(config)
    if teacher:
        models.append(("actor_rollout_ref", teacher, arr.actor.ulysses_sequence_parallel_size))
        _check_teacher_vocabulary(config, teacher, found)
    if config.use_critic:
        models.append(("critic", config.critic.model.path, config.critic.ulysses_sequence_parallel_size))
    for section, path, sp in models:
        model_config = _model_config(path)
        if model_config is None:
            continue
        reason = logit_transform(model_config)
        if section == "actor_rollout_ref" and arr.model.use_fused_kernels is True and reason:
            found.add(
                f"actor_rollout_ref.model.use_fused_kernels=True, but {_shown(path)} cannot use the fused output "
                f"layer: {reason}; set it to null (the full logits then) or false"
            )
        heads = model_config.get("num_attention_heads")
        if isinstance(heads, int) and sp > heads:
            key = f"{section}.actor" if section == "actor_rollout_ref" else section
            found.add(
                f"{key}.ulysses_sequence_parallel_size={sp} is more than the {heads} attention heads of "
                f"{_shown(path)}; use at most {heads}"
            )


def _check_teacher_vocabulary(config, teacher: str, found: Findings) -> None:
    """The reference model (hybrid/distillation.py) grades the student's token ids: same tokenizer."""
    from hybrid.distillation import teacher_vocabulary_problem

    model = config.actor_rollout_ref.model
    if _placeholder(model.path) or _placeholder(model.tokenizer_path):
        return  # the default model is prepared by the run, after these checks
    full = os.path.abspath(os.path.expanduser(teacher))
    # A local folder without tokenizer files has only its output size to compare.
    has_tokenizer = not os.path.isdir(full) or bool(set(os.listdir(full)) & set(TOKENIZER_FILES))
    local = [os.path.expanduser(p) for p in (model.path, model.tokenizer_path or model.path, teacher)]
    try:
        problem = teacher_vocabulary_problem(
            local[0], local[1], local[2], local[2] if has_tokenizer else None, model.trust_remote_code
        )
    except LOAD_ERRORS as err:
        found.add(f"actor_rollout_ref.ref.model.path={teacher!r}: cannot read its config or tokenizer ({err})", err)
        return
    if problem:
        found.add(problem)


def _model_config(path: str | None) -> dict | None:
    """A local model folder's config.json as a dict, or None (hub ids, placeholders)."""
    full = os.path.join(os.path.abspath(os.path.expanduser(str(path or ""))), "config.json")
    if not path or _placeholder(path) or not os.path.isfile(full):
        return None
    with open(full) as f:
        return json.load(f)


def check_language_model(config, found: Findings) -> None:
    """`model.language_model_only` against the checkpoint (workers/language_model.py): true needs
    a multimodal one, a multimodal one needs true; vLLM's own switch needs the policy's."""
    from workers.language_model import language_model_problem

    arr = config.actor_rollout_ref
    sections = [("actor_rollout_ref.model", arr.model)]
    if config.use_critic:
        sections.append(("critic.model", config.critic.model))
    for section, model in sections:
        model_config = _model_config(model.path)
        if model_config is not None:
            problem = language_model_problem(
                f"{section}.language_model_only", _shown(model.path), model_config, model.language_model_only
            )
            if problem:
                found.add(problem)
    engine = dict(arr.rollout.engine_kwargs.vllm or {}).get("language_model_only", False)
    if arr.rollout.name == "vllm" and engine is True and not arr.model.language_model_only:
        found.add(
            "actor_rollout_ref.rollout.engine_kwargs.vllm.language_model_only=true starts the engine without the "
            "vision encoder while actor_rollout_ref.model.language_model_only=false loads the whole checkpoint; "
            "set actor_rollout_ref.model.language_model_only=true as well"
        )


def _in_hub_cache(repo_id: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return False
    return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)


def model_folder_problem(path: str, needs: set[str]) -> str | None:
    """Why `path` cannot serve as a model (config + weights) and/or tokenizer folder."""
    full = os.path.abspath(os.path.expanduser(path))
    if not os.path.exists(full):
        if _REPO_ID.match(path) and _in_hub_cache(path):
            return None
        hint = (
            (
                f"; it is not in the Hugging Face cache either, and hybrid does not download: fetch it first "
                f"(huggingface-cli download {path}) or give the local folder"
            )
            if _REPO_ID.match(path)
            else ""
        )
        return f"model folder {_shown(path)} does not exist{hint}"
    if not os.path.isdir(full):
        return f"{_shown(path)} is a file; give the Hugging Face model folder (config.json, weights, tokenizer)"
    names = set(os.listdir(full))
    if "model" in needs:
        problem = _model_files_problem(full, names)
        if problem:
            return f"{_shown(path)} {problem}"
    if "tokenizer" in needs and not names & set(TOKENIZER_FILES):
        return (
            f"{_shown(path)} has no tokenizer ({' / '.join(TOKENIZER_FILES[:2])}); "
            f"set the tokenizer_path key to a folder that has one"
        )
    return None


def _model_files_problem(full: str, names: set[str]) -> str | None:
    if "fsdp_config.json" in names or any(n.startswith("model_world_size_") for n in names):
        return (
            f"is a training checkpoint, not a model folder; turn it into one with `python -m scripts.model_merger "
            f"merge --backend fsdp --local_dir {full} --target_dir <folder>`, or use "
            f"{os.path.join(full, 'huggingface')} "
            f"once merged"
        )
    if "config.json" not in names:
        return "has no config.json: not a Hugging Face model folder"
    try:
        with open(os.path.join(full, "config.json")) as f:
            model_config = json.load(f)
    except (OSError, ValueError) as err:
        return f"has a config.json that cannot be read as JSON ({err})"
    if not isinstance(model_config, dict) or "model_type" not in model_config:
        return "has a config.json without model_type: not a transformers model config"
    if not any(n.endswith(WEIGHT_SUFFIXES) for n in names):
        return "has config.json but no weights (*.safetensors or pytorch_model*.bin)"
    return None


# ----------------------------------------------------------------------------- data


def _data_files(config) -> list[tuple[str, str]]:
    """(key, path) of every data file named, placeholders left out."""
    out = []
    for key, value in (("data.train_files", config.data.train_files), ("data.val_files", config.data.val_files)):
        if value is None:
            continue
        for path in (value,) if isinstance(value, str) else value:
            if not _placeholder(path):
                out.append((key, str(path)))
    return out


def check_data_files(config, found: Findings) -> dict[tuple[str, str], Counter]:
    """Check every data file; returns (key, path) -> count of each data_source value."""
    data = config.data
    sources: dict[tuple[str, str], Counter] = {}
    custom = data.custom_cls.path
    if custom and not os.path.isfile(os.path.expanduser(custom)):
        found.add(f"data.custom_cls.path: dataset file {_shown(custom)} not found")
    train_rows = 0
    rows_known = not custom  # a custom dataset class reads its files its own way
    for key, path in _data_files(config):
        full = path if is_spec(path) else os.path.abspath(os.path.expanduser(path))
        counts = None
        if not is_spec(path) and not os.path.isfile(full):
            what = (
                "is a folder; name the parquet or JSON-lines files in it" if os.path.isdir(full) else "does not exist"
            )
            found.add(f"{key}: data file {_shown(path)} {what}")
        elif not custom:
            try:
                rows, counts = _check_rows(full, data)
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


def _check_rows(path: str, data) -> tuple[int, Counter]:
    """Rows of one data file and its data_source counts; ValueError names what is wrong."""
    prompt_key, source_key = data.prompt_key, data.reward_fn_key
    media = {data.image_key: "data.image_key", data.video_key: "data.video_key"}
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
    return rows, Counter(str(v) for v in values.get(source_key, []) if v is not _MISSING and v is not None)


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
