"""What every rollout engine shares: the reading of the rollout config, and its output.

`sampling_settings` turns the `actor_rollout_ref.rollout` section (and the call's
meta_info) into one engine-neutral `SamplingSettings`; each engine translates that into
its own parameters (vLLM `SamplingParams`, transformers `GenerationConfig`).
`engine_load_format` says what verl's `load_format` values mean for the engine's first
weights. `assemble_rollout` builds, from left-padded prompts and per sample the
generated token ids (and the engine's log-probs of them), the DataProto the trainer
consumes: `prompts` (B, P), `responses` (B, R) right-padded with the pad id,
`input_ids` = prompt|response, `attention_mask`, `position_ids` continuing the prompt's,
`response_mask` (1 through the EOS token), and `rollout_log_probs` (B, R) when the
engine gave them. Samples of one prompt are adjacent (prompt 0's n samples, then prompt
1's), matching `DataProto.repeat(n, interleave=True)` on the driver.

Every engine also has the token-in-token-out primitive the multi-turn loop
(workers/rollout/multi_turn.py) drives, one call per turn for all live trajectories:

    generate_ids(prompt_ids: list[list[int]], settings: SamplingSettings, max_tokens: list[int])
        -> list[GeneratedTurn]     # one sample per prompt (settings.n must be 1)

where each prompt carries its own token budget and no prompt plus its budget may exceed
the engine's `max_model_len` (`engine_max_model_len`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import torch

from protocol.data_proto import DataProto

if TYPE_CHECKING:  # annotations only: the config package imports worker modules
    from workers.config import RolloutConfig

ROLLOUT = "actor_rollout_ref.rollout"

# verl's load_format values. `dummy*`: the engine starts with random weights; the actor's
# are loaded into it before its first generation and after every update, so the random
# ones never sample. The others read the model folder's weights first; verl's
# `hf`/`dtensor` name how verl's FSDP workers send weights to the engine, which hybrid
# always does one way, so for the engine they all mean "read the checkpoint" (vLLM's own
# `auto`; `safetensors` is vLLM's name for the same, kept as it is).
DUMMY_LOAD_FORMATS = ("dummy_dtensor", "dummy_hf", "dummy")
CHECKPOINT_LOAD_FORMATS = ("dtensor", "hf", "auto", "safetensors")
_MEGATRON_LOAD_FORMATS = ("dummy_megatron", "megatron")


def engine_load_format(load_format: str) -> str:
    """The vLLM `load_format` for verl's `actor_rollout_ref.rollout.load_format`:
    "dummy" (random first weights) or a format that reads the model folder ("auto",
    "safetensors"). The HF engine follows the same answer (from_config or
    from_pretrained)."""
    if load_format in DUMMY_LOAD_FORMATS:
        return "dummy"
    if load_format in ("dtensor", "hf", "auto"):
        return "auto"
    if load_format == "safetensors":
        return "safetensors"
    if load_format in _MEGATRON_LOAD_FORMATS:
        raise ValueError(
            f"{ROLLOUT}.load_format={load_format!r} is verl's weight loader for a Megatron actor, and hybrid "
            f"trains with FSDP only; use dummy_dtensor (random first weights, the actor's are synced in before "
            f"generating) "
            f"or hf (the engine reads the model folder first)"
        )
    raise ValueError(
        f"{ROLLOUT}.load_format={load_format!r} is not supported; use one of "
        f"{', '.join(DUMMY_LOAD_FORMATS + CHECKPOINT_LOAD_FORMATS)}"
    )


def plain(value):
    """Mappings and lists of a config section (DictConfig/ListConfig, dicts, tuples) as
    plain dicts and lists, nested ones too: for libraries that validate their arguments'
    types (vLLM's engine arguments) and for pickling into other processes."""
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return [plain(v) for v in value]
    return value


@dataclass(frozen=True)
class SamplingSettings:
    """One generation call's sampling, in vLLM's `SamplingParams` terms (top_k -1 or 0:
    off; min_p 0: off; penalties 1.0 / 0.0: off; empty stop lists: none)."""

    n: int
    temperature: float
    top_p: float
    top_k: int
    max_tokens: int
    greedy: bool
    ignore_eos: bool = False
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()


def _stop_strings(value) -> tuple[str, ...]:
    if value is None:
        return ()
    # vLLM takes one string for `stop` as well as a list; so does this.
    items = (value,) if isinstance(value, str) else value
    if not isinstance(items, Sequence) or not all(isinstance(s, str) and s for s in items):
        raise ValueError(
            f"{ROLLOUT}.stop={value!r}: must be null or a list of non-empty strings, e.g. stop='[\"</answer>\"]'"
        )
    return tuple(items)


def _stop_token_ids(value) -> tuple[int, ...]:
    if value is None:
        return ()
    if (
        isinstance(value, (str, bytes))
        or not isinstance(value, Sequence)
        or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value)
    ):
        raise ValueError(f"{ROLLOUT}.stop_token_ids={value!r}: must be null or a list of token ids (integers >= 0)")
    return tuple(int(t) for t in value)


def repeat_greedy(token_ids: list, log_probs: list | None, n: int) -> tuple[list, list | None]:
    """Each prompt's one greedy continuation as its n samples (consecutive, as the engines
    return n samples per prompt): greedy decoding gives every copy the same tokens."""
    token_ids = [ids for ids in token_ids for _ in range(n)]
    return token_ids, None if log_probs is None else [lp for lp in log_probs for _ in range(n)]


def sampling_settings(config: RolloutConfig, meta_info: dict) -> SamplingSettings:
    """The sampling of one call, from the rollout section `config` and the call's meta_info.

    verl's rules: validation (`meta_info["validate"]`) takes top_k/top_p/temperature/n
    from `val_kwargs`, and is greedy with one sample when `val_kwargs.do_sample` is false
    or its temperature is 0; training may be made greedy by `do_sample=False` (config or
    meta_info) and takes n and temperature from meta_info when given. Greedy means
    temperature 0 and no top-k/top-p/min-p filter, with one sample in validation and in a
    call whose meta_info asks for do_sample=False (unless it gives n), and n identical ones in
    training made greedy by the config. The other SamplingParams
    keys (min_p, repetition/presence/frequency penalty, stop, stop_token_ids, ignore_eos)
    come from the rollout section in every mode; the penalties and stops also apply to
    greedy decoding, as in vLLM.
    """
    common = dict(
        max_tokens=int(config.response_length),
        ignore_eos=bool(config.ignore_eos),
        repetition_penalty=float(config.repetition_penalty),
        presence_penalty=float(config.presence_penalty),
        frequency_penalty=float(config.frequency_penalty),
        stop=_stop_strings(config.stop),
        stop_token_ids=_stop_token_ids(config.stop_token_ids),
    )
    greedy_filters = dict(n=1, temperature=0.0, top_p=1.0, top_k=-1, min_p=0.0, greedy=True)
    if meta_info.get("validate", False):
        kw = config.val_kwargs
        if not kw.do_sample or float(kw.temperature) == 0:
            return SamplingSettings(**greedy_filters, **common)
        return SamplingSettings(
            n=int(kw.n),
            temperature=float(kw.temperature),
            top_p=float(kw.top_p),
            top_k=int(kw.top_k),
            min_p=float(config.min_p),
            greedy=False,
            **common,
        )
    if "do_sample" in meta_info and not meta_info["do_sample"]:
        # A greedy call the driver asks for (ReMax's baseline): one sample per prompt, as verl's.
        return SamplingSettings(**{**greedy_filters, "n": int(meta_info.get("n", 1))}, **common)
    if not meta_info.get("do_sample", config.do_sample):
        # rollout.do_sample=false: verl repeats each prompt n times and decodes every copy greedily,
        # n identical samples, so the groups keep their size (the engines decode once: repeat_greedy).
        return SamplingSettings(**{**greedy_filters, "n": int(meta_info.get("n", config.n))}, **common)
    return SamplingSettings(
        n=int(meta_info.get("n", config.n)),
        temperature=float(meta_info.get("temperature", config.temperature)),
        top_p=float(config.top_p),
        top_k=int(config.top_k),
        min_p=float(config.min_p),
        greedy=False,
        **common,
    )


class GeneratedTurn(NamedTuple):
    """One sample of `generate_ids`: the token ids exactly as sampled, the engine's log-prob
    of each, and why it ended: "stop" (EOS, a stop token or stop string) or "length"."""

    token_ids: list[int]
    log_probs: list[float]
    finish_reason: str


def engine_max_model_len(config: RolloutConfig) -> int:
    """The longest prompt + response the engine holds: `max_model_len`, or prompt_length +
    response_length when unset."""
    return int(config.max_model_len or (int(config.prompt_length) + int(config.response_length)))


def check_turn_requests(
    prompt_ids: list[list[int]], settings: SamplingSettings, max_tokens: list[int], max_model_len: int
):
    """Refuse a `generate_ids` call that breaks its contract (the multi-turn loop never
    makes one; a caller that does learns which request)."""
    if settings.n != 1:
        raise ValueError(f"generate_ids samples one continuation per prompt; got settings.n={settings.n}")
    if len(max_tokens) != len(prompt_ids):
        raise ValueError(f"generate_ids got {len(prompt_ids)} prompts but {len(max_tokens)} token budgets")
    for i, (ids, budget) in enumerate(zip(prompt_ids, max_tokens)):
        if budget < 1 or len(ids) + budget > max_model_len:
            raise ValueError(
                f"generate_ids request {i}: prompt of {len(ids)} tokens + max_tokens {budget} does not fit "
                f"max_model_len {max_model_len} (or max_tokens < 1)"
            )


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    return torch.clamp(attention_mask.long().cumsum(-1) - 1, min=0)


def assemble_rollout(
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    prompt_position_ids: torch.Tensor,
    response_token_ids: list[list[int]],
    response_log_probs: list[list[float]] | None,
    n: int,
    response_length: int,
    pad_token_id: int,
    eos_token_ids: set[int],
    meta_info: dict | None = None,
) -> DataProto:
    num_samples = len(response_token_ids)
    if num_samples != prompt_ids.shape[0] * n:
        raise RuntimeError(f"engine returned {num_samples} samples for {prompt_ids.shape[0]} prompts x n={n}")
    responses = torch.full((num_samples, response_length), pad_token_id, dtype=torch.long)
    response_mask = torch.zeros((num_samples, response_length), dtype=torch.long)
    log_probs = torch.zeros((num_samples, response_length), dtype=torch.float32)
    for i, tokens in enumerate(response_token_ids):
        tokens = list(tokens)[:response_length]
        length = len(tokens)
        # The mask runs through the first EOS; anything an engine emitted after it is cut.
        for j, tok in enumerate(tokens):
            if tok in eos_token_ids:
                length = j + 1
                break
        if length:
            responses[i, :length] = torch.tensor(tokens[:length], dtype=torch.long)
            response_mask[i, :length] = 1
            if response_log_probs is not None:
                log_probs[i, :length] = torch.tensor(response_log_probs[i][:length], dtype=torch.float32)

    prompts = prompt_ids.repeat_interleave(n, dim=0)
    prompt_mask = prompt_mask.repeat_interleave(n, dim=0)
    prompt_pos = prompt_position_ids.repeat_interleave(n, dim=0)
    delta = torch.arange(1, response_length + 1, dtype=prompt_pos.dtype).unsqueeze(0)
    response_pos = prompt_pos[..., -1:] + delta  # (B, R), or (B, 4, R) for multimodal positions (workers/vision.py)
    tensors = {
        "prompts": prompts,
        "responses": responses,
        "input_ids": torch.cat([prompts, responses], dim=-1),
        "attention_mask": torch.cat([prompt_mask, response_mask], dim=-1),
        "position_ids": torch.cat([prompt_pos, response_pos], dim=-1),
        "response_mask": response_mask,
    }
    if response_log_probs is not None:
        tensors["rollout_log_probs"] = log_probs
    return DataProto.from_dict(tensors=tensors, meta_info=dict(meta_info or {}))


def prompt_token_lists(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> list[list[int]]:
    """Strip left padding: the engine takes each prompt's real tokens only."""
    return [row[mask.bool()].tolist() for row, mask in zip(input_ids, attention_mask)]
