"""Prompt data for PPO: RLHFDataset and its collate function (the resumable loader over it is
hybrid/data_loader.py's).

Rows follow verl's schema (`prompt` as a chat list or a string, `data_source`,
`reward_model.ground_truth`, `extra_info`), read from parquet or JSON-lines files. Each item
is the prompt rendered with the tokenizer's chat template, left padded to
`data.max_prompt_length`, plus every other column of the row; `collate_fn` makes a dict
that `DataProto.from_single_dict` takes.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from reward.row_fields import IMAGES_SEEN, images_seen

TRUNCATION_MODES = ("error", "left", "right", "middle")
_FIX_LENGTH = (
    "raise data.max_prompt_length, set data.filter_overlong_prompts=true to drop such rows, "
    "or set data.truncation to left, right or middle"
)


class DataError(ValueError):
    """Prompt data that cannot be used; the message names the file, and the row if one."""


def _plain(value):
    if hasattr(value, "_metadata") and hasattr(value, "_get_node"):
        from omegaconf import OmegaConf

        return OmegaConf.to_container(value, resolve=True)
    return value


def _as_file_list(data_files) -> list[str]:
    data_files = _plain(data_files)
    if isinstance(data_files, (str, os.PathLike)):
        return [os.fspath(data_files)]
    files = [os.fspath(f) for f in data_files]
    if not files:
        raise DataError("no data files given (data.train_files / data.val_files is an empty list)")
    return files


# ---- reading files ----------------------------------------------------------------------


def read_rows(path: str) -> list[dict]:
    """All rows of a parquet, JSON-lines or JSON-array file as dicts of plain Python values
    (or of an `env-seeds:` spec, episodes made from seeds: hybrid/env_seeds.py)."""
    from hybrid.env_seeds import is_spec, spec_rows

    if is_spec(path):
        return spec_rows(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"data file {path!r} does not exist (check data.train_files / data.val_files)")
    if os.path.getsize(path) == 0:
        raise DataError(f"data file {path} is empty (0 bytes)")
    lower = path.lower()
    if lower.endswith(".parquet"):
        import pyarrow.parquet as pq

        rows = pq.read_table(path).to_pylist()
    elif lower.endswith((".jsonl", ".json")):
        rows = _read_json(path)
    else:
        raise DataError(f"data file {path}: unknown format; use .parquet, .jsonl or .json")
    if not rows:
        raise DataError(f"data file {path} has no rows")
    return rows


def _read_json(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if text.lstrip().startswith("["):
        rows = json.loads(text)
    else:
        rows = []
        for lineno, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise DataError(f"data file {path} line {lineno}: not valid JSON ({e})") from e
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise DataError(f"data file {path} row {i}: expected a JSON object, got {type(row).__name__}")
    return rows


def reward_model_from_spec(row: dict) -> dict:
    """A SkyRL dataset row (its `reward_spec` dict, no verl `reward_model`) gets `reward_model` =
    `reward_spec`, so SkyRL's data loads as it is for single-turn scoring too (environments
    read `reward_spec` either way)."""
    if row.get("reward_model") is None and isinstance(row.get("reward_spec"), dict):
        row["reward_model"] = row["reward_spec"]
    return row


# ---- prompts to token ids ---------------------------------------------------------------


def truncate_ids(ids: Sequence[int], max_length: int, truncation: str, where: str = "") -> list[int]:
    """`ids` cut to `max_length` tokens: keep the end (left), the start (right), or both
    halves (middle); `error` raises, naming `where`."""
    ids = list(ids)
    if len(ids) <= max_length:
        return ids
    if truncation == "left":
        return ids[-max_length:]
    if truncation == "right":
        return ids[:max_length]
    if truncation == "middle":
        left = max_length // 2
        right = max_length - left
        return ids[:left] + (ids[-right:] if right else [])
    if truncation == "error":
        raise DataError(
            f"{where}prompt is {len(ids)} tokens, longer than data.max_prompt_length={max_length} "
            f"(data.truncation=error): {_FIX_LENGTH}"
        )
    raise DataError(f"unknown data.truncation {truncation!r}; known: {', '.join(TRUNCATION_MODES)}")


def left_pad(ids: Sequence[int], max_length: int, pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """input_ids, attention_mask and position_ids (cumsum of the mask - 1, clipped at 0)."""
    n_pad = max_length - len(ids)
    input_ids = torch.tensor([pad_token_id] * n_pad + list(ids), dtype=torch.long)
    attention_mask = torch.tensor([0] * n_pad + [1] * len(ids), dtype=torch.long)
    position_ids = torch.clip(torch.cumsum(attention_mask, dim=-1) - 1, min=0)
    return input_ids, attention_mask, position_ids


def render_prompt(tokenizer, prompt, chat_kwargs: dict, where: str = "") -> str:
    """Chat lists go through the chat template (with the generation prompt); strings are used as is."""
    if isinstance(prompt, np.ndarray):
        prompt = prompt.tolist()
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and all(isinstance(m, dict) and "role" in m and "content" in m for m in prompt):
        if not getattr(tokenizer, "chat_template", None):
            raise DataError(
                f"{where}the prompt is a chat list but the tokenizer has no chat template; use plain-string "
                f"prompts or a tokenizer with one"
            )
        return tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False, **chat_kwargs)
    raise DataError(
        f"{where}the prompt must be a string or a list of {{'role', 'content'}} messages, got "
        f"{type(prompt).__name__}: {str(prompt)[:200]}"
    )


_WORKER_STATE: dict = {}


def _init_length_worker(tokenizer, chat_kwargs) -> None:
    _WORKER_STATE["tokenizer"] = tokenizer
    _WORKER_STATE["chat_kwargs"] = chat_kwargs


def _lengths_of(prompts_and_where: list[tuple[Any, str]]) -> list[int]:
    tokenizer, chat_kwargs = _WORKER_STATE["tokenizer"], _WORKER_STATE["chat_kwargs"]
    texts = [render_prompt(tokenizer, p, chat_kwargs, where) for p, where in prompts_and_where]
    return [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]


def prompt_lengths(
    tokenizer, prompts_and_where: list[tuple[Any, str]], chat_kwargs: dict, num_workers: int = 1
) -> list[int]:
    """Token counts of rendered prompts, in a spawn pool of `num_workers` processes when > 1."""
    chunk = 512
    chunks = [prompts_and_where[i : i + chunk] for i in range(0, len(prompts_and_where), chunk)]
    if num_workers <= 1 or len(chunks) <= 1:
        _init_length_worker(tokenizer, chat_kwargs)
        try:
            return [n for c in chunks for n in _lengths_of(c)]
        finally:
            _WORKER_STATE.clear()
    # spawn, not fork: the driver may already hold Ray and torch threads.
    with multiprocessing.get_context("spawn").Pool(
        min(num_workers, len(chunks)), initializer=_init_length_worker, initargs=(tokenizer, chat_kwargs)
    ) as pool:
        return [n for part in pool.map(_lengths_of, chunks) for n in part]


# ---- the dataset ------------------------------------------------------------------------


def max_samples_indices(total: int, max_samples: int, shuffle: bool, seed: int | None) -> list[int]:
    """The rows verl's RLHFDataset keeps of `total` for `max_samples`, in its order: with
    `shuffle`, numpy's `default_rng(seed).choice(total, max_samples, replace=False)`, else the first."""
    if not shuffle:
        return list(range(max_samples))
    rng = np.random.default_rng(*((seed,) if seed is not None else ()))
    return rng.choice(total, size=max_samples, replace=False).tolist()


class RLHFDataset(Dataset):
    """Prompts from one or more parquet/JSON-lines files, tokenized and left padded.

    Config keys (verl's `data.*`): prompt_key, max_prompt_length, truncation,
    filter_overlong_prompts, filter_overlong_prompts_workers, return_raw_chat,
    return_full_prompt, apply_chat_template_kwargs.
    """

    def __init__(self, data_files, tokenizer, config, processor=None, max_samples: int = -1):
        self.data_files = _as_file_list(data_files)
        self.tokenizer = tokenizer
        self.config = config
        self.prompt_key = config.prompt_key
        self.max_prompt_length = config.max_prompt_length
        self.truncation = config.truncation
        self.filter_overlong_prompts = config.filter_overlong_prompts
        self.num_workers = config.filter_overlong_prompts_workers
        self.return_raw_chat = config.return_raw_chat
        self.return_full_prompt = config.return_full_prompt
        self.chat_kwargs = dict(config.apply_chat_template_kwargs)
        if self.max_prompt_length < 1:
            raise DataError(f"data.max_prompt_length must be >= 1, got {self.max_prompt_length}")
        if self.truncation not in TRUNCATION_MODES:
            raise DataError(f"unknown data.truncation {self.truncation!r}; known: {', '.join(TRUNCATION_MODES)}")
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        if self.pad_token_id is None:
            raise DataError("the tokenizer has neither a pad token nor an eos token to pad prompts with")
        self.vision = None  # a processor: prompts with images (hybrid/multimodal.py)
        if processor is not None:
            from hybrid.multimodal import VisionPrompts

            self.vision = VisionPrompts(processor, config, self.pad_token_id, self.chat_kwargs)

        self.rows: list[dict] = []
        self.origins: list[tuple[str, int]] = []
        for path in self.data_files:
            rows = read_rows(path)
            for i, row in enumerate(rows):
                reward_model_from_spec(row)
                if self.prompt_key not in row:
                    raise DataError(
                        f"data file {path} row {i}: no column {self.prompt_key!r} (data.prompt_key); "
                        f"columns present: {sorted(row)}"
                    )
            self.rows.extend(rows)
            self.origins.extend((path, i) for i in range(len(rows)))
        if 0 < max_samples < len(self.rows):  # verl's data.train_max_samples / val_max_samples
            keep = max_samples_indices(len(self.rows), max_samples, config.shuffle, config.seed)
            self.rows, self.origins = [self.rows[i] for i in keep], [self.origins[i] for i in keep]
        self._check_lengths()

    def _where(self, item: int) -> str:
        path, row = self.origins[item]
        return f"data file {path} row {row}: "

    def _check_lengths(self) -> None:
        """Drop overlong rows (filter_overlong_prompts), or with truncation=error find the
        first one now rather than mid-training."""
        if not (self.filter_overlong_prompts or self.truncation == "error"):
            return
        if self.vision is not None:  # image tokens count too: the processor's own lengths
            lengths = [self.vision.length(row, row[self.prompt_key], self._where(i)) for i, row in enumerate(self.rows)]
        else:
            lengths = prompt_lengths(
                self.tokenizer,
                [(row[self.prompt_key], self._where(i)) for i, row in enumerate(self.rows)],
                self.chat_kwargs,
                self.num_workers,
            )
        keep = [i for i, n in enumerate(lengths) if n <= self.max_prompt_length]
        if len(keep) == len(lengths):
            return
        if not self.filter_overlong_prompts:
            first = next(i for i, n in enumerate(lengths) if n > self.max_prompt_length)
            raise DataError(
                f"{self._where(first)}prompt is {lengths[first]} tokens, longer than data.max_prompt_length="
                f"{self.max_prompt_length} (data.truncation=error; {len(lengths) - len(keep)} of {len(lengths)} "
                f"rows are too long): {_FIX_LENGTH}"
            )
        if not keep:
            raise DataError(
                f"all {len(lengths)} prompts of {self.data_files} are longer than data.max_prompt_length="
                f"{self.max_prompt_length} (the longest has {max(lengths)} tokens)"
            )
        print(
            f"filter_overlong_prompts: dropped {len(lengths) - len(keep)} of {len(lengths)} rows over "
            f"{self.max_prompt_length} tokens"
        )
        self.rows = [self.rows[i] for i in keep]
        self.origins = [self.origins[i] for i in keep]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, item: int) -> dict:
        row = dict(self.rows[item])
        prompt = row.pop(self.prompt_key)
        where = self._where(item)
        if self.vision is not None:
            return self._vision_item(item, row, prompt, where)
        text = render_prompt(self.tokenizer, prompt, self.chat_kwargs, where)
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        ids = truncate_ids(ids, self.max_prompt_length, self.truncation, where)
        input_ids, attention_mask, position_ids = left_pad(ids, self.max_prompt_length, self.pad_token_id)
        row["input_ids"] = input_ids
        row["attention_mask"] = attention_mask
        row["position_ids"] = position_ids
        row["raw_prompt_ids"] = ids
        if self.return_raw_chat:
            row["raw_prompt"] = prompt.tolist() if isinstance(prompt, np.ndarray) else prompt
        if self.return_full_prompt:
            row["full_prompts"] = text
        return self._with_index(item, row)

    def _vision_item(self, item: int, row: dict, prompt, where: str) -> dict:
        row.update(self.vision.encode(row, prompt, where, self.return_full_prompt))
        # what the model saw of the images, for scorers that read box coordinates (reward/row_fields.py)
        processor = self.vision.processor
        grid = row["multi_modal_inputs"].get("image_grid_thw")
        row[IMAGES_SEEN] = images_seen(processor.config.model_type, processor.image_processor.patch_size, grid)
        if self.return_raw_chat:
            row["raw_prompt"] = prompt.tolist() if isinstance(prompt, np.ndarray) else prompt
        return self._with_index(item, row)

    def _with_index(self, item: int, row: dict) -> dict:
        extra_info = row.get("extra_info")
        index = extra_info.get("index") if isinstance(extra_info, dict) else None
        row["index"] = item if index is None else index
        return row


def collate_fn(data_list: list[dict]) -> dict:
    """Tensors stacked on a new first dimension; everything else as a 1-D object array."""
    if not data_list:
        raise ValueError("collate_fn got an empty batch")
    keys = list(data_list[0])
    for i, item in enumerate(data_list[1:], start=1):
        if list(item) != keys:
            raise ValueError(f"batch item {i} has keys {sorted(item)}, item 0 has {sorted(keys)}")
    out: dict = {}
    for key in keys:
        values = [item[key] for item in data_list]
        if all(isinstance(v, torch.Tensor) for v in values):
            out[key] = torch.stack(values, dim=0)
        else:
            # fromiter keeps lists and dicts as single objects instead of a 2-D array.
            out[key] = np.fromiter(values, dtype=object, count=len(values))
    return out


def _load_class(path: str, name: str):
    from reward.user_code import load_user_file

    module, resolved = load_user_file(path, "data.custom_cls.path", "dataset", "custom_dataset")
    if not hasattr(module, name):
        classes = sorted(k for k, v in vars(module).items() if isinstance(v, type) and v.__module__ == module.__name__)
        raise AttributeError(
            f"data.custom_cls.name: class {name!r} not found in {resolved}; classes there: {classes or 'none'}"
        )
    cls = getattr(module, name)
    if not (isinstance(cls, type) and issubclass(cls, Dataset)):
        raise TypeError(f"data.custom_cls: {name} in {resolved} must be a subclass of torch.utils.data.Dataset")
    return cls


def create_rl_dataset(data_paths, data_config, tokenizer, processor=None, max_samples: int = -1) -> Dataset:
    """An RLHFDataset, or the user's class from `data.custom_cls.{path,name}` (same arguments).

    A user's class gets the `data` section as an OmegaConf DictConfig, as verl's datasets
    do (their code calls `config.get(...)`); ours reads the typed section.
    """
    custom = data_config.custom_cls
    if not custom.path:
        return RLHFDataset(data_paths, tokenizer, data_config, processor=processor, max_samples=max_samples)
    if not custom.name:
        raise ValueError(f"data.custom_cls.path is {custom.path!r} but data.custom_cls.name is not set")
    from omegaconf import OmegaConf

    cls = _load_class(custom.path, custom.name)
    verl_view = OmegaConf.create(dataclasses.asdict(data_config))
    extra = {"max_samples": max_samples} if max_samples > 0 else {}  # verl passes it; a class of its kind takes it
    return cls(data_files=data_paths, tokenizer=tokenizer, config=verl_view, processor=processor, **extra)
