"""The reward-model worker: a sequence classifier scores prompt+response, and the score is
placed on the last response token (`rm_scores`, shaped like the responses).

When the reward model's tokenizer or chat template differs from the policy's
(`reward_model.model.input_tokenizer`), each sample is decoded with the policy's tokenizer
and re-templated with the reward model's before scoring.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from protocol.data_proto import DataProto
from protocol.dispatch import Dispatch, register
from reward.reward_model_inputs import needs_retemplate, retemplated_ids
from workers.base import Worker
from workers.device import current_device
from workers.fsdp_utils import offload_params, on_device
from workers.micro_batch import micro_batch_indices
from workers.model_loading import load_hf_model, load_tokenizer

if TYPE_CHECKING:  # annotations only: the config package imports worker modules
    from workers.config import RewardModelConfig


class RewardModelWorker(Worker):
    """config: the `reward_model` section."""

    def __init__(self, config: RewardModelConfig):
        super().__init__()
        self.config = config

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self):
        from transformers import AutoModelForSequenceClassification

        model = self.config.model
        self.rm_tokenizer = load_tokenizer(model.path, model.trust_remote_code)
        self.input_tokenizer = load_tokenizer(model.input_tokenizer, False) if model.input_tokenizer else None
        self.retemplate = needs_retemplate(self.input_tokenizer, self.rm_tokenizer)
        self.module, _ = load_hf_model(
            AutoModelForSequenceClassification,
            model.path,
            model.fsdp_config,
            seed=0,
            trainable=False,
            trust_remote_code=model.trust_remote_code,
            num_labels=1,
            pad_token_id=self.rm_tokenizer.pad_token_id,
        )
        if model.fsdp_config.param_offload:
            offload_params(self.module)
        return True

    def _retemplated_batch(self, data: DataProto):
        tok_in, tok_rm = self.input_tokenizer, self.rm_tokenizer
        prompts = data.batch["prompts"]
        responses = data.batch["responses"]
        response_mask = data.batch["response_mask"]
        prompt_mask = data.batch["attention_mask"][:, : prompts.shape[1]]
        max_len = self.config.max_length
        raw = data.non_tensor_batch.get("raw_prompt")
        rows = [
            retemplated_ids(
                tok_in,
                tok_rm,
                prompts[i][prompt_mask[i].bool()].tolist(),
                responses[i][response_mask[i].bool()].tolist(),
                None if raw is None else raw[i],
                max_len,
            )
            for i in range(len(data))
        ]
        width = max(len(r) for r in rows)
        input_ids = torch.full((len(rows), width), tok_rm.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            input_ids[i, : len(r)] = torch.tensor(r)
            attention_mask[i, : len(r)] = 1
        return input_ids, attention_mask

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    @torch.no_grad()
    def compute_rm_score(self, data: DataProto) -> DataProto:
        cfg = self.config
        self.module.eval()
        if self.retemplate:
            input_ids, attention_mask = self._retemplated_batch(data)
            position_ids = torch.clamp(attention_mask.cumsum(-1) - 1, min=0)
        else:
            input_ids = data.batch["input_ids"]
            attention_mask = data.batch["attention_mask"]
            position_ids = data.batch["position_ids"]
        batching = cfg.batching
        scores = torch.zeros(len(data), dtype=torch.float32)
        device = current_device()
        with on_device(self.module, cfg.model.fsdp_config):
            for idx in micro_batch_indices(attention_mask, batching, self.world_size):
                index = torch.tensor(idx, dtype=torch.long)
                out = self.module(
                    input_ids=input_ids[index].to(device),
                    attention_mask=attention_mask[index].to(device),
                    position_ids=position_ids[index].to(device),
                    use_cache=False,
                )
                scores[index] = out.logits[:, 0].float().cpu()
        response_mask = data.batch["response_mask"]
        rm_scores = torch.zeros(response_mask.shape, dtype=torch.float32)
        last = (response_mask.sum(-1) - 1).clamp(min=0)
        rm_scores[torch.arange(len(data)), last] = scores
        return DataProto.from_dict(tensors={"rm_scores": rm_scores})
