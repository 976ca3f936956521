"""What every rollout engine returns, assembled in one place.

Given left-padded prompts and, per sample, the generated token ids (and the engine's
log-probs of them), build the DataProto the trainer consumes: `prompts` (B, P),
`responses` (B, R) right-padded with the pad id, `input_ids` = prompt|response,
`attention_mask`, `position_ids` continuing the prompt's, `response_mask` (1 through the
EOS token), and `rollout_log_probs` (B, R) when the engine gave them. Samples of one
prompt are adjacent (prompt 0's n samples, then prompt 1's), matching
`DataProto.repeat(n, interleave=True)` on the driver.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from protocol.data_proto import DataProto


@dataclass
class SamplingSettings:
    n: int
    temperature: float
    top_p: float
    top_k: int
    max_tokens: int
    greedy: bool
    ignore_eos: bool = False


def sampling_settings(config, meta_info: dict) -> SamplingSettings:
    """verl's rule: validation uses `val_kwargs`; `do_sample=False` means greedy, one sample."""
    if meta_info.get("validate", False):
        kw = config.val_kwargs
        greedy = not kw.get("do_sample", False) or float(kw.get("temperature", 0)) == 0
        return SamplingSettings(
            n=1 if greedy else int(kw.get("n", 1)),
            temperature=0.0 if greedy else float(kw.temperature),
            top_p=1.0 if greedy else float(kw.get("top_p", 1.0)),
            top_k=-1 if greedy else int(kw.get("top_k", -1)),
            max_tokens=int(config.response_length),
            greedy=greedy,
            ignore_eos=bool(config.get("ignore_eos", False)),
        )
    do_sample = meta_info.get("do_sample", config.get("do_sample", True))
    greedy = not do_sample
    return SamplingSettings(
        n=1 if greedy else int(meta_info.get("n", config.n)),
        temperature=0.0 if greedy else float(meta_info.get("temperature", config.temperature)),
        top_p=1.0 if greedy else float(config.top_p),
        top_k=-1 if greedy else int(config.top_k),
        max_tokens=int(config.response_length),
        greedy=greedy,
        ignore_eos=bool(config.get("ignore_eos", False)),
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
        raise RuntimeError(
            f"engine returned {num_samples} samples for {prompt_ids.shape[0]} prompts x n={n}"
        )
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
    response_pos = prompt_pos[:, -1:] + delta
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
