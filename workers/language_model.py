"""The language model of a multimodal checkpoint, loaded alone (`model.language_model_only`).

A multimodal checkpoint (Qwen3.5, Qwen3-VL: a config with a `vision_config`) holds a vision
encoder and a language model. With `actor_rollout_ref.model.language_model_only=true` (and
`critic.model.language_model_only` for the critic) the roles load only the language model,
as SkyRL's `trainer.policy/ref.language_model_only` do (AutoModelForCausalLM on the
checkpoint): the model class is built from the checkpoint's text config, the vision weights
are never read, and the language model's weights are read from where the checkpoint keeps
them (`model.language_model.*` in transformers' layout) under the text model's own names.

Two things the plain transformers call gets wrong are fixed here: the text config does not
carry the composite's `tie_word_embeddings` (Qwen3.5 ties its output layer at the top
level: loaded without it, the output layer would start random), and transformers' own prefix
renaming exists only for its causal-LM class (the critic's token classifier would load
nothing). `LanguageModelLoad` says what to load and under which names; `engine_names` gives
the checkpoint's names for the trained weights, which a vLLM engine started on the
multimodal checkpoint (`language_model_only` among its engine arguments) expects.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch


def is_multimodal(hf_config) -> bool:
    """A config with a vision encoder (SkyRL's test: a `vision_config` that is not None)."""
    return getattr(hf_config, "vision_config", None) is not None


def not_multimodal_message(key: str, path: str, hf_config) -> str:
    return (
        f"{key}=true loads the language model of a multimodal checkpoint, and {path} is not one (its "
        f"{type(hf_config).__name__} has no vision_config); set {key}=false"
    )


def text_config_of(hf_config):
    """The composite config's text config, with the composite's output-layer tie."""
    text = hf_config.get_text_config()
    tie = getattr(hf_config, "tie_word_embeddings", None)
    if tie is not None:
        text.tie_word_embeddings = bool(tie)
    return text


def _checkpoint_file(path: str, name: str) -> str | None:
    """`name` in the model folder `path`, or in a Hugging Face repo's cached (else downloaded)
    snapshot, as from_pretrained finds it; None when the checkpoint has no such file."""
    if os.path.isdir(path):
        full = os.path.join(path, name)
        return full if os.path.isfile(full) else None
    from transformers.utils import cached_file

    return cached_file(path, name, _raise_exceptions_for_missing_entries=False)


def checkpoint_weight_names(path: str) -> list[str]:
    """The tensor names a safetensors checkpoint holds (its index, else its files' headers)."""
    index = _checkpoint_file(path, "model.safetensors.index.json")
    if index is not None:
        with open(index) as f:
            return sorted(json.load(f)["weight_map"])
    from safetensors import safe_open

    if os.path.isdir(path):
        files = [os.path.join(path, n) for n in sorted(os.listdir(path)) if n.endswith(".safetensors")]
    else:
        files = [f for f in [_checkpoint_file(path, "model.safetensors")] if f is not None]
    if not files:
        raise FileNotFoundError(
            f"model.language_model_only=true reads the weight names of {path}, which holds no .safetensors file"
        )
    names = []
    for file in files:
        with safe_open(file, "pt") as f:
            names.extend(f.keys())
    return sorted(names)


def language_model_prefix(model_names: Iterable[str], base: str, checkpoint_names: Iterable[str]) -> str:
    """Where the checkpoint keeps the weights the text model holds under `base` ("model."):
    the one prefix P such that P + rest is a checkpoint name for every `base` + rest."""
    rests = sorted({n[len(base) :] for n in model_names if n.startswith(base)})
    if not rests:
        raise ValueError(f"the text model has no weights under {base!r}")
    held = set(checkpoint_names)
    probe = max(rests, key=len)  # the most specific name: one checkpoint prefix ends with it
    prefixes = sorted(
        {c[: -len(probe)] for c in held if c.endswith(probe) and (c == probe or c[-len(probe) - 1] == ".")}
    )
    found = [p for p in prefixes if all(p + rest in held for rest in rests)]
    if len(found) != 1:
        raise ValueError(
            f"model.language_model_only=true: the checkpoint holds the language model's weights under "
            f"{len(found)} prefixes ({found}) where one was expected; its names do not follow transformers' layout"
        )
    return found[0]


def token_classifier_class(text_config):
    """A token classifier (the critic's value model) over the text model of `text_config`:
    transformers' generic one on the text model class its AutoModel maps the config to."""
    from transformers import AutoModel
    from transformers.modeling_layers import GenericForTokenClassification

    base = AutoModel._model_mapping[type(text_config)]
    pretrained = next(c for c in base.__mro__[1:] if c.__name__.endswith("PreTrainedModel"))
    name = base.__name__.removesuffix("Model") + "ForTokenClassification"
    attributes = {"config_class": type(text_config), "__module__": __name__}
    return type(name, (GenericForTokenClassification, pretrained), attributes)


@dataclass
class LanguageModelLoad:
    """What `load_hf_model` loads with language_model_only: the class, its (text) config, and
    the renaming of checkpoint names to the class's (`key_mapping` of from_pretrained)."""

    model_class: type
    config: object
    key_mapping: dict[str, str]
    checkpoint_prefix: str  # where the checkpoint keeps the text model's `model.` weights

    @classmethod
    def resolve(cls, auto_cls, path: str, hf_config, key: str) -> LanguageModelLoad:
        if not is_multimodal(hf_config):
            raise ValueError(not_multimodal_message(key, path, hf_config))
        from transformers import AutoModelForTokenClassification

        text = text_config_of(hf_config)
        mapping = auto_cls._model_mapping
        if auto_cls is AutoModelForTokenClassification and type(text) not in mapping:
            model_class = token_classifier_class(text)
        elif type(text) in mapping:
            model_class = mapping[type(text)]
        else:
            raise ValueError(
                f"{key}=true: transformers has no {auto_cls.__name__} for the text config "
                f"{type(text).__name__} of {path}; set {key}=false"
            )
        base = model_class.base_model_prefix + "."
        with torch.device("meta"):
            names = [n for n, _ in model_class(text).named_parameters()]
        held = checkpoint_weight_names(path)
        prefix = language_model_prefix(names, base, held)
        mapping = {} if prefix == base else {"^" + re.escape(prefix): base}
        if model_class.__module__ == __name__:
            # Our own class (the critic's): the checkpoint's other weights (the vision encoder's,
            # the output layer) are not read, and transformers' load report need not list them.
            others = {".".join(n.split(".")[:2]) if n.count(".") > 1 else n for n in held if not n.startswith(prefix)}
            model_class._keys_to_ignore_on_load_unexpected = ["^" + re.escape(o) + r"(\.|$)" for o in sorted(others)]
        return cls(model_class, text, mapping, prefix)

    def check_loaded(self, missing_keys: Iterable[str], path: str) -> None:
        """Every weight of the text model must come from the checkpoint (a value head may not)."""
        base = self.model_class.base_model_prefix + "."
        lost = sorted(n for n in missing_keys if n.startswith(base))
        if lost:
            raise ValueError(
                f"model.language_model_only=true: {len(lost)} language-model weights of {path} did not load "
                f"({lost[:3]}...)"
            )

    def engine_names(self) -> Callable[[str], str]:
        """The checkpoint's name of a trained weight (what an engine started on the checkpoint reads)."""
        return checkpoint_namer(self.model_class.base_model_prefix + ".", self.checkpoint_prefix)


def checkpoint_namer(base: str, prefix: str) -> Callable[[str], str]:
    """`base` + rest -> `prefix` + rest; other names (the output layer) as they are."""
    if base == prefix:
        return lambda name: name
    return lambda name: prefix + name[len(base) :] if name.startswith(base) else name


def engine_namer(path: str, trust_remote_code: bool, key: str) -> Callable[[str], str]:
    """The checkpoint's names for the causal LM's weights that `load_hf_model` loads from the
    multimodal checkpoint at `path` with `key`=true: what a vLLM engine started on that
    checkpoint reads (`model.language_model.*` for Qwen3.5: vLLM maps them onto its language
    model, with or without its vision encoder)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    hf_config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    return LanguageModelLoad.resolve(AutoModelForCausalLM, path, hf_config, key).engine_names()


def language_model_problem(key: str, path: str, config_json: dict, language_model_only: bool) -> str | None:
    """The refusal, if any, of `key` (a model section's language_model_only) for the checkpoint
    whose config.json is `config_json`: true needs a multimodal checkpoint, and a multimodal one
    needs true (hybrid feeds text only; without it transformers' causal-LM class would load the
    language model with the composite's output-layer tie dropped)."""
    multimodal = config_json.get("vision_config") is not None
    kind = config_json.get("model_type", "?")
    if language_model_only and not multimodal:
        return (
            f"{key}=true loads the language model of a multimodal checkpoint, and {path} is not one (model_type "
            f"{kind}, no vision_config); set {key}=false"
        )
    if multimodal and not language_model_only:
        return (
            f"{path} is a multimodal checkpoint (model_type {kind}, with a vision_config) and hybrid trains on text: "
            f"set {key}=true to load and train its language model alone"
        )
    return None


__all__ = [
    "LanguageModelLoad",
    "checkpoint_namer",
    "checkpoint_weight_names",
    "engine_namer",
    "is_multimodal",
    "language_model_problem",
    "language_model_prefix",
    "not_multimodal_message",
    "text_config_of",
    "token_classifier_class",
]
