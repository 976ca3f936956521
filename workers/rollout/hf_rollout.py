"""A rollout engine on transformers' `generate`, for machines without vLLM.

It keeps its own unsharded copy of the policy in the rollout dtype, refreshed through the
same `update_weights` path as the vLLM engine; with several ranks each rank generates its
own share without any collective, so ranks that stop at different lengths never wait on
each other. Left-padded prompts go in; the output has the same fields as vLLM's.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from protocol.data_proto import DataProto
from workers.device import current_device, resolve_dtype_name
from workers.rollout.base import assemble_rollout, sampling_settings

_DTYPES = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32, "fp32": torch.float32}


class HFRollout:
    def __init__(self, model_path: str, config, tokenizer, model_hf_config):
        from transformers import AutoModelForCausalLM

        self.config = config
        self.tokenizer = tokenizer
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        eos = getattr(model_hf_config, "eos_token_id", None) or tokenizer.eos_token_id
        self.eos_token_ids = set(eos if isinstance(eos, list) else [eos])
        dtype = _DTYPES[resolve_dtype_name(str(config.get("dtype", "auto")))]
        # Built normally (not on the meta device) so non-persistent buffers such as the
        # rotary frequencies are initialised; the weights arrive with update_weights.
        self.model = AutoModelForCausalLM.from_config(model_hf_config, dtype=dtype).to(current_device())
        self.model.eval()
        self.engine_dtype = dtype
        self.seed = int(config.get("seed", 0))
        self.calls = 0

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        params = dict(self.model.named_parameters())
        params.update(dict(self.model.named_buffers()))
        with torch.no_grad():
            for name, tensor in named_tensors:
                if name in params:
                    params[name].copy_(tensor.to(params[name].dtype))
        self.model.tie_weights()

    def state_dict(self) -> dict:
        """The sampling counter that seeds each call: checkpointed so a resumed run samples alike."""
        return {"calls": self.calls}

    def load_state_dict(self, state: dict) -> None:
        self.calls = int(state["calls"])

    def sleep(self) -> None:
        pass

    def wake_up(self) -> None:
        pass

    @torch.no_grad()
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        from transformers import GenerationConfig

        settings = sampling_settings(self.config, prompts.meta_info)
        input_ids = prompts.batch["input_ids"]
        attention_mask = prompts.batch["attention_mask"]
        gen_config = GenerationConfig(
            do_sample=not settings.greedy,
            temperature=settings.temperature if not settings.greedy else None,
            top_p=settings.top_p if not settings.greedy else None,
            top_k=(settings.top_k if settings.top_k > 0 else None) if not settings.greedy else None,
            max_new_tokens=settings.max_tokens,
            num_return_sequences=settings.n,
            pad_token_id=self.pad_token_id,
            eos_token_id=sorted(self.eos_token_ids),
            min_new_tokens=settings.max_tokens if settings.ignore_eos else None,
            output_scores=True,
            return_dict_in_generate=True,
        )
        # Only sampling calls advance the seed: greedy validation (which a resumed run may
        # repeat) must not shift the samples of the training steps that follow.
        if not settings.greedy:
            self.calls += 1
        generator_state = torch.random.get_rng_state()
        torch.manual_seed(self.seed + self.calls)
        device = current_device()
        out = self.model.generate(
            input_ids=input_ids.to(device),
            attention_mask=attention_mask.to(device),
            generation_config=gen_config,
        )
        torch.random.set_rng_state(generator_state)
        prompt_len = input_ids.shape[1]
        sequences = out.sequences[:, prompt_len:].cpu()
        # `scores` are the processed (temperature/top-k/top-p) logits of each step.
        steps = torch.stack(out.scores, dim=1).float().log_softmax(-1).cpu() if out.scores else None
        token_ids, log_probs = [], []
        for i in range(sequences.shape[0]):
            toks = sequences[i].tolist()
            token_ids.append(toks)
            if steps is not None:
                log_probs.append(steps[i, torch.arange(len(toks)), sequences[i]].tolist())
        return assemble_rollout(
            input_ids,
            attention_mask,
            prompts.batch["position_ids"],
            token_ids,
            log_probs if steps is not None else None,
            n=settings.n,
            response_length=int(self.config.response_length),
            pad_token_id=self.pad_token_id,
            eos_token_ids=self.eos_token_ids,
            meta_info={"n": settings.n},
        )
