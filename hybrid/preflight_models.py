"""Checks of the model folders a run names, before anything loads (part of hybrid/preflight.py's
`check_inputs`): each model and tokenizer folder (actor, reference, critic, reward model) exists
and holds a config, weights and tokenizer files, a Hugging Face repo id is in the local cache;
settings the model's config.json refuses (the fused output layer for a model that transforms its
logits, more sequence-parallel ranks than heads, tensor-parallel engine shards that would split
heads); a reference model of its own (a distillation teacher) with the actor's vocabulary;
`model.language_model_only` against the checkpoint."""

from __future__ import annotations

import json
import os
import re
from typing import TYPE_CHECKING

from hybrid.defaults import DEFAULT_ASSET_PREFIX

if TYPE_CHECKING:
    from hybrid.preflight import Findings

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
WEIGHT_SUFFIXES = (".safetensors", ".bin")
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
# Errors a file raises while loading: reported, with the cause.
LOAD_ERRORS = (OSError, ImportError, AttributeError, TypeError, ValueError, SyntaxError)


def is_placeholder(path) -> bool:
    return isinstance(path, str) and path.startswith(DEFAULT_ASSET_PREFIX)


def shown_path(path: str) -> str:
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
        if not path or is_placeholder(path):
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
                f"actor_rollout_ref.model.use_fused_kernels=True, but {shown_path(path)} cannot use the fused output "
                f"layer: {reason}; set it to null (the full logits then) or false"
            )
        heads = model_config.get("num_attention_heads")
        if isinstance(heads, int) and sp > heads:
            key = f"{section}.actor" if section == "actor_rollout_ref" else section
            found.add(
                f"{key}.ulysses_sequence_parallel_size={sp} is more than the {heads} attention heads of "
                f"{shown_path(path)}; use at most {heads}"
            )
    _check_tensor_parallel_heads(config, found)


def _check_tensor_parallel_heads(config, found: Findings) -> None:
    """A tensor-parallel engine gives each shard whole attention heads and key/value heads
    (vLLM's rules, workers/rollout/tensor_parallel.py); the engine generates with the policy."""
    from workers.rollout.tensor_parallel import head_problem, heads_of

    arr = config.actor_rollout_ref
    model_config = _model_config(arr.model.path)
    if model_config is not None:
        problem = head_problem(
            arr.rollout.tensor_model_parallel_size, *heads_of(model_config), shown_path(arr.model.path)
        )
        if problem:
            found.add(problem)


def _check_teacher_vocabulary(config, teacher: str, found: Findings) -> None:
    """The reference model (hybrid/distillation.py) grades the student's token ids: same tokenizer."""
    from hybrid.distillation import teacher_vocabulary_problem

    model = config.actor_rollout_ref.model
    if is_placeholder(model.path) or is_placeholder(model.tokenizer_path):
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
    if not path or is_placeholder(path) or not os.path.isfile(full):
        return None
    with open(full) as f:
        return json.load(f)


def check_language_model(config, found: Findings) -> None:
    """`model.language_model_only` against the checkpoint (workers/language_model.py): true needs
    a multimodal one, a multimodal one needs true; vLLM's own switch needs the policy's."""
    from hybrid.multimodal import vision_checkpoint_type, vision_problems
    from workers.language_model import language_model_problem
    from workers.rollout.engine import engine_spec
    from workers.vision import VISION_MODELS

    arr = config.actor_rollout_ref
    sections = [("actor_rollout_ref.model", arr.model)]
    if config.use_critic:
        sections.append(("critic.model", config.critic.model))
    for section, model in sections:
        model_config = _model_config(model.path)
        vision = vision_checkpoint_type(model) if section == "actor_rollout_ref.model" else None
        if vision in VISION_MODELS:  # a vision-language policy, trained whole (hybrid/multimodal.py)
            for problem in vision_problems(config, vision):
                found.add(problem)
        elif model_config is not None:
            problem = language_model_problem(
                f"{section}.language_model_only", shown_path(model.path), model_config, model.language_model_only
            )
            if problem:
                found.add(problem)
    engine = dict(arr.rollout.engine_kwargs.vllm or {}).get("language_model_only", False)
    reads_section = engine_spec(arr.rollout.name).engine_kwargs_section is not None
    if reads_section and engine is True and not arr.model.language_model_only:
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
        return f"model folder {shown_path(path)} does not exist{hint}"
    if not os.path.isdir(full):
        return f"{shown_path(path)} is a file; give the Hugging Face model folder (config.json, weights, tokenizer)"
    names = set(os.listdir(full))
    if "model" in needs:
        problem = _model_files_problem(full, names)
        if problem:
            return f"{shown_path(path)} {problem}"
    if "tokenizer" in needs and not names & set(TOKENIZER_FILES):
        return (
            f"{shown_path(path)} has no tokenizer ({' / '.join(TOKENIZER_FILES[:2])}); "
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


__all__ = [
    "check_language_model",
    "check_model_folders",
    "check_model_settings",
    "is_placeholder",
    "model_folder_problem",
    "shown_path",
]
