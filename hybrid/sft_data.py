"""SFT data: parquet (or JSON) rows to token ids and a loss mask, and the default SFT data.

Two row shapes, as verl's SFT datasets read them:

- single-turn (`data.prompt_key`, `data.response_key`, walked into by `prompt_dict_keys` /
  `response_dict_keys` for nested columns): the prompt, a string, becomes one user message
  rendered with the chat template and its generation prompt (a chat list is rendered as
  it is); the response is appended with the tokenizer's EOS. The loss covers the response.
- multi-turn (`data.multiturn.enable`): a list of {role, content} messages (tools and the
  thinking switch per row, when present, go to the chat template). The conversation is
  rendered one message at a time; each assistant message's tokens are what the template
  adds after the previous messages and the generation prompt, i.e. exactly what the model
  would generate at that turn, up to and including the EOS that ends it. The loss covers
  those tokens only: never the system, user or tool turns, the role headers, or the
  template's newline after EOS.

`loss_mask[t] = 1` marks token t as a target (predicted from the tokens before it). Every
row is tokenized when the dataset is built, so a bad row fails the run before training,
named by file and row; `data.truncation` handles rows over `data.max_length`.

`write_arithmetic_sft_parquet` writes the default job's data: the arithmetic task's own
questions (hybrid/arithmetic_task.py) with worked answers that end in the number.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from hybrid.data import DataError, _as_file_list, read_rows

_FIX_LENGTH = "raise data.max_length, or set data.truncation=left or right"


def _plain(value):
    """numpy arrays (how parquet list columns may arrive) as Python lists, recursively."""
    if isinstance(value, np.ndarray):
        return [_plain(v) for v in value.tolist()]
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _walk(row: dict, key: str, dict_keys, where: str, what: str):
    if key not in row:
        raise DataError(f"{where}: no column {key!r} (data.{what}_key); columns: {', '.join(sorted(row))}")
    value = _plain(row[key])
    path = key
    for sub in dict_keys or ():
        # verl's series_to_item: a one-element list holding the dict is unwrapped.
        while isinstance(value, list) and len(value) == 1:
            value = value[0]
        if not isinstance(value, dict) or sub not in value:
            have = f"keys {sorted(value)}" if isinstance(value, dict) else type(value).__name__
            raise DataError(f"{where}: {path} has no key {sub!r} (data.{what}_dict_keys); it holds {have}")
        value, path = value[sub], f"{path}[{sub!r}]"
    return value, path


class SFTTokenizer:
    """Token ids and loss masks of single- and multi-turn samples under one tokenizer."""

    def __init__(self, tokenizer, chat_kwargs: dict | None = None):
        self.tokenizer = tokenizer
        self.chat_kwargs = dict(chat_kwargs or {})

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def render(self, messages: list[dict], generation_prompt: bool, **extra) -> str:
        return self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=generation_prompt, tokenize=False, **self.chat_kwargs, **extra
        )

    def single_turn(self, prompt, response: str) -> tuple[list[int], list[int]]:
        chat = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
        prompt_ids = self.encode(self.render(chat, True))
        response_ids = self.encode(response + self.tokenizer.eos_token)
        return prompt_ids + response_ids, [0] * len(prompt_ids) + [1] * len(response_ids)

    def multi_turn(self, messages: list[dict], **extra) -> tuple[list[int], list[int]]:
        """Each message's tokens as the difference of the rendered prefixes; assistant
        messages are rendered after the generation prompt and trained up to their EOS."""
        ids: list[int] = []
        mask: list[int] = []
        done = ""  # the text rendered so far
        eos = self.tokenizer.eos_token
        for i, message in enumerate(messages):
            pieces: list[tuple[str, int]] = []
            if message.get("role") == "assistant":
                header = self.render(messages[:i], True, **extra) if i else ""
                full = self.render(messages[: i + 1], False, **extra)
                _check_prefix(done, header, i)
                _check_prefix(header, full, i)
                turn = full[len(header) :]
                cut = turn.rfind(eos) + len(eos) if eos and eos in turn else len(turn)
                pieces = [(header[len(done) :], 0), (turn[:cut], 1), (turn[cut:], 0)]
            else:
                full = self.render(messages[: i + 1], False, **extra)
                _check_prefix(done, full, i)
                pieces = [(full[len(done) :], 0)]
            for text, label in pieces:
                if text:
                    piece = self.encode(text)
                    ids += piece
                    mask += [label] * len(piece)
            done = full
        return ids, mask


def _check_prefix(prefix: str, text: str, index: int) -> None:
    if not text.startswith(prefix):
        raise DataError(
            f"message {index}: the chat template renders the conversation so far differently once this message is "
            f"added, so the tokens of each turn cannot be told apart; use a template that only appends "
            f"(data.chat_template)"
        )


def truncate(ids: list[int], mask: list[int], max_length: int, truncation: str, where: str):
    if len(ids) <= max_length:
        return ids, mask
    if truncation == "left":
        return ids[-max_length:], mask[-max_length:]
    if truncation == "right":
        return ids[:max_length], mask[:max_length]
    raise DataError(
        f"{where}: the sample is {len(ids)} tokens, longer than data.max_length={max_length} "
        f"(data.truncation={truncation}): {_FIX_LENGTH}"
    )


class SFTDataset(Dataset):
    """All samples of `files` (data.train_files / val_files), tokenized once; `config` is
    the typed `data` section. Items are {"input_ids", "loss_mask"} lists."""

    def __init__(self, files, tokenizer, config, max_samples: int = -1):
        if config.chat_template:
            tokenizer.chat_template = config.chat_template
        self.tok = SFTTokenizer(tokenizer, config.apply_chat_template_kwargs)
        self.config = config
        self.samples: list[tuple[list[int], list[int]]] = []
        for path in _as_file_list(files):
            for index, row in enumerate(read_rows(path)):
                if 0 < max_samples <= len(self.samples):
                    return
                where = f"data file {path} row {index}"
                self.samples.append(self._tokenize(row, where))

    def _tokenize(self, row: dict, where: str) -> tuple[list[int], list[int]]:
        cfg = self.config
        try:
            if cfg.multiturn.enable:
                ids, mask = self._multi_turn(row, where)
            else:
                prompt, prompt_path = _walk(row, cfg.prompt_key, cfg.prompt_dict_keys, where, "prompt")
                response, response_path = _walk(row, cfg.response_key, cfg.response_dict_keys, where, "response")
                if not isinstance(prompt, (str, list)):
                    raise DataError(f"{where}: {prompt_path} is {type(prompt).__name__}, not a string or chat list")
                if not isinstance(response, str):
                    raise DataError(f"{where}: {response_path} is {type(response).__name__}, not a string")
                ids, mask = self.tok.single_turn(prompt, response)
        except DataError as err:
            if str(err).startswith(where):
                raise
            raise DataError(f"{where}: {err}") from err
        except Exception as err:  # the chat template's own errors: say which row
            raise DataError(f"{where}: cannot be tokenized ({type(err).__name__}: {err})") from err
        return truncate(ids, mask, cfg.max_length, cfg.truncation, where)

    def _multi_turn(self, row: dict, where: str):
        mt = self.config.multiturn
        if mt.messages_key not in row:
            raise DataError(f"{where}: no column {mt.messages_key!r} (data.multiturn.messages_key)")
        messages = _plain(row[mt.messages_key])
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise DataError(f"{where}: {mt.messages_key} must be a non-empty list of {{role, content}} messages")
        if not any(m.get("role") == "assistant" for m in messages):
            raise DataError(f"{where}: the conversation has no assistant message, so nothing to train on")
        extra = {}
        tools = _plain(row.get(mt.tools_key))
        if isinstance(tools, str):
            tools = json.loads(tools)
        if tools:
            extra["tools"] = tools
        if row.get(mt.enable_thinking_key) is not None:
            extra["enable_thinking"] = bool(row[mt.enable_thinking_key])
        return self.tok.multi_turn(messages, **extra)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, item: int) -> dict:
        ids, mask = self.samples[item]
        return {"input_ids": ids, "loss_mask": mask}

    def token_count(self) -> int:
        return sum(len(ids) for ids, _ in self.samples)


def make_collate(pad_token_id: int):
    """Right-padded tensors of a list of samples, as long as the batch's longest one:
    input_ids, attention_mask, position_ids, loss_mask (all (B, L))."""

    def collate(items: list[dict]) -> dict[str, torch.Tensor]:
        width = max(len(it["input_ids"]) for it in items)
        ids = torch.full((len(items), width), pad_token_id, dtype=torch.long)
        attention = torch.zeros((len(items), width), dtype=torch.long)
        loss = torch.zeros((len(items), width), dtype=torch.long)
        for row, it in enumerate(items):
            n = len(it["input_ids"])
            ids[row, :n] = torch.tensor(it["input_ids"])
            attention[row, :n] = 1
            loss[row, :n] = torch.tensor(it["loss_mask"])
        position = torch.clip(torch.cumsum(attention, dim=-1) - 1, min=0)
        return {"input_ids": ids, "attention_mask": attention, "position_ids": position, "loss_mask": loss}

    return collate


# ---- the default job's data ---------------------------------------------------------------


def worked_answer(a: int, op: str, b: int, result: int) -> str:
    """The working for `a op b`, ending in the result (the scorer reads the last integer).
    Addition of numbers with tens adds tens and ones separately."""
    if op == "+" and max(a, b) >= 10:
        tens, ones = (a // 10 + b // 10) * 10, a % 10 + b % 10
        return f"{a} + {b} = {a // 10 * 10} + {b // 10 * 10} + {a % 10} + {b % 10} = {tens} + {ones} = {result}"
    return f"{a} {op} {b} = {result}"


def sft_rows(rl_rows: list[dict]) -> list[dict]:
    """Arithmetic rows (verl's RL schema) with `question` (the RL prompt's text) and `answer`."""
    out = []
    for row in rl_rows:
        info = row["extra_info"]
        result = int(row["reward_model"]["ground_truth"])
        out.append(
            {
                "question": row["prompt"][0]["content"],
                "answer": worked_answer(int(info["a"]), info["op"], int(info["b"]), result),
                **row,
            }
        )
    return out


def write_arithmetic_sft_parquet(out_dir, n_train: int = 2000, n_val: int = 200, seed: int = 1) -> dict[str, Path]:
    """train.parquet / val.parquet of worked answers, from the same generator, mix and seeds
    as the PPO job's data (so the held-out questions are the PPO job's held-out questions)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from hybrid.arithmetic_task import DEFAULT_MIX, make_arithmetic_rows

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"train": out / "train.parquet", "val": out / "val.parquet"}
    splits = {
        "train": make_arithmetic_rows(n_train, seed, "train", **DEFAULT_MIX),
        "val": make_arithmetic_rows(n_val, seed + 1_000_003, "val", **DEFAULT_MIX),
    }
    for split, rows in splits.items():
        tmp = paths[split].with_suffix(".parquet.tmp")
        pq.write_table(pa.Table.from_pylist(sft_rows(rows)), tmp)
        tmp.replace(paths[split])
    return paths


__all__ = ["SFTDataset", "SFTTokenizer", "make_collate", "worked_answer", "write_arithmetic_sft_parquet"]
