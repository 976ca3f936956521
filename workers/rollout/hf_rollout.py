"""A rollout engine on transformers' `generate`, for machines without vLLM.

It keeps its own unsharded copy of the policy in the rollout dtype, refreshed through the
same `update_weights` path as the vLLM engine; its first weights follow
`actor_rollout_ref.rollout.load_format` as vLLM's do (random for `dummy*`, the model
folder's for `hf`/`auto`). With several ranks each rank generates its own share without
any collective, so ranks that stop at different lengths never wait on each other.
Left-padded prompts go in; the output has the same fields as vLLM's.

The rollout's sampling keys map onto `GenerationConfig` in `hf_generation_config`:
temperature, top_k, top_p, min_p, repetition_penalty (applied, as in vLLM, to prompt and
response tokens), stop strings, stop_token_ids as extra EOS ids, ignore_eos as a minimum
length. presence_penalty and frequency_penalty have no equivalent in `generate` and are
refused when set.

`generate_ids` (the multi-turn primitive) left-pads the token-id prompts, generates up to
the largest budget of the call and cuts each sample at its own budget: the tokens before
the cut come from the same distribution as with that budget alone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch

from protocol.data_proto import DataProto
from workers.device import current_device, resolve_dtype_name
from workers.rollout.base import (
    ROLLOUT,
    GeneratedTurn,
    SamplingSettings,
    assemble_rollout,
    check_turn_requests,
    engine_load_format,
    engine_max_model_len,
    repeat_greedy,
    sampling_settings,
)
from workers.rollout.engine import HF_ENGINE
from workers.rollout.step_wise import loop_for_engine
from workers.vision import MULTI_MODAL_INPUTS, generation_inputs, model_class
from workers.vision_messages import vision_processor_of

if TYPE_CHECKING:  # annotations only: the config package imports worker modules
    from workers.config import ModelConfig, RolloutConfig

_DTYPES = {
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "float32": torch.float32,
    "fp32": torch.float32,
}


def hf_generation_config(settings: SamplingSettings, pad_token_id: int, eos_token_ids: Iterable[int]):
    """The `GenerationConfig` of one call. Every filter is set explicitly: a value left
    None would be taken from the model's generation_config.json or transformers' defaults
    (top_k 50), which the rollout config never asked for."""
    from transformers import GenerationConfig

    for key in ("presence_penalty", "frequency_penalty"):
        value = getattr(settings, key)
        if value != 0:
            raise ValueError(
                f"{ROLLOUT}.{key}={value}: transformers' generate has no equivalent (rollout.name=hf); "
                f"set it to 0 or use rollout.name=vllm"
            )
    if settings.ignore_eos and settings.stop_token_ids:
        # generate's minimum length holds back every EOS id, and stop_token_ids are EOS ids here.
        raise ValueError(
            f"{ROLLOUT}.ignore_eos=true with stop_token_ids={list(settings.stop_token_ids)}: the hf engine would "
            f"ignore the stop tokens as well; drop one of the two or use rollout.name=vllm"
        )
    sample = not settings.greedy
    return GenerationConfig(
        do_sample=sample,
        temperature=settings.temperature if sample else None,
        top_p=settings.top_p if sample else None,
        # top_k 0 switches the filter off in generate; -1 and 0 mean "off" in the config.
        top_k=max(settings.top_k, 0) if sample else None,
        min_p=settings.min_p if sample else None,
        repetition_penalty=settings.repetition_penalty,
        max_new_tokens=settings.max_tokens,
        # Greedy decoding samples once (generate refuses more); the caller repeats it n times.
        num_return_sequences=1 if settings.greedy else settings.n,
        pad_token_id=pad_token_id,
        eos_token_id=sorted(set(eos_token_ids) | set(settings.stop_token_ids)),
        min_new_tokens=settings.max_tokens if settings.ignore_eos else None,
        output_scores=True,
        return_dict_in_generate=True,
    )


class HFRollout:
    def __init__(self, model_config: ModelConfig, config: RolloutConfig, tokenizer, model_hf_config):
        """`model_config` is `actor_rollout_ref.model` (path, trust_remote_code), `config`
        is `actor_rollout_ref.rollout`."""
        from transformers import AutoModelForCausalLM

        self.config = config
        self.tokenizer = tokenizer
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        eos = getattr(model_hf_config, "eos_token_id", None) or tokenizer.eos_token_id
        self.eos_token_ids = set(eos if isinstance(eos, list) else [eos])
        # Settings generate cannot honour fail here, before the model is built.
        for meta_info in ({}, {"validate": True}):
            hf_generation_config(sampling_settings(config, meta_info), self.pad_token_id, self.eos_token_ids)
        stop = sampling_settings(config, {}).stop
        self.stop_criteria = None
        if stop:
            from transformers import StoppingCriteriaList, StopStringCriteria

            # Built once: it preprocesses the whole vocabulary.
            self.stop_criteria = StoppingCriteriaList([StopStringCriteria(tokenizer, list(stop))])
        # A vision-language checkpoint generates with its vision tower (workers/vision.py).
        AutoModelForCausalLM = model_class(model_hf_config, AutoModelForCausalLM)  # noqa: N806
        self.hf_config = model_hf_config
        dtype = _DTYPES[resolve_dtype_name(str(config.dtype))]
        trust_remote_code = bool(model_config.trust_remote_code)
        load_format = engine_load_format(config.load_format)
        if load_format == "dummy":
            # Built normally (not on the meta device) so non-persistent buffers such as the
            # rotary frequencies are initialised; the weights arrive with update_weights.
            model = AutoModelForCausalLM.from_config(model_hf_config, dtype=dtype, trust_remote_code=trust_remote_code)
        else:
            model = AutoModelForCausalLM.from_pretrained(
                model_config.path,
                config=model_hf_config,
                dtype=dtype,
                trust_remote_code=trust_remote_code,
                use_safetensors=True if load_format == "safetensors" else None,
            )
        self.model = model.to(current_device())
        self.model.eval()
        self.engine_dtype = dtype
        self.seed = int(config.seed)
        self.calls = 0
        self.max_model_len = engine_max_model_len(config)
        # A vision-language policy's multi-turn loop renders images with the processor.
        self.processor = vision_processor_of(model_config, model_hf_config)
        self.multi_turn = loop_for_engine(self, None)
        self.capabilities = HF_ENGINE.capabilities()

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

    # transformers' generate keeps its copy of the policy resident: no sleep levels, and the
    # colocated sequence's sleep and wake steps are no-ops here.
    def sleep(self, level: int) -> None:
        pass

    def wake_up(self, tags: tuple[str, ...] | None = None) -> None:
        pass

    def reset_caches(self) -> None:
        pass  # generate keeps no cache between calls

    def _sample(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, settings: SamplingSettings, images=None):
        """generate on left-padded prompts: per row the generated ids (cut after a stop
        string), their log-probs, and whether a stop string ended the row."""
        gen_config = hf_generation_config(settings, self.pad_token_id, self.eos_token_ids)
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
            stopping_criteria=self.stop_criteria,
            **({} if images is None else generation_inputs(self.hf_config, input_ids, images, device)),
        )
        torch.random.set_rng_state(generator_state)
        prompt_len = input_ids.shape[1]
        sequences = out.sequences[:, prompt_len:].cpu()
        lengths = self._stop_string_lengths(out.sequences.cpu(), prompt_len)
        # `scores` are the processed (temperature/top-k/top-p) logits of each step.
        steps = torch.stack(out.scores, dim=1).float().log_softmax(-1).cpu() if out.scores else None
        token_ids, log_probs = [], []
        for i in range(sequences.shape[0]):
            toks = sequences[i, : lengths[i]].tolist()
            token_ids.append(toks)
            if steps is not None:
                log_probs.append(steps[i, torch.arange(len(toks)), sequences[i, : len(toks)]].tolist())
        stopped_by_string = [length < sequences.shape[1] for length in lengths]
        return token_ids, (log_probs if steps is not None else None), stopped_by_string

    @torch.no_grad()
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        self.multi_turn = loop_for_engine(self, self.multi_turn)
        if self.multi_turn is not None:
            return self.multi_turn.generate_sequences(prompts)
        settings = sampling_settings(self.config, prompts.meta_info)
        input_ids = prompts.batch["input_ids"]
        attention_mask = prompts.batch["attention_mask"]
        images = prompts.non_tensor_batch.get(MULTI_MODAL_INPUTS)
        token_ids, log_probs, _ = self._sample(input_ids, attention_mask, settings, images)
        if settings.greedy:
            token_ids, log_probs = repeat_greedy(token_ids, log_probs, settings.n)
        return assemble_rollout(
            input_ids,
            attention_mask,
            prompts.batch["position_ids"],
            token_ids,
            log_probs,
            n=settings.n,
            response_length=int(self.config.response_length),
            pad_token_id=self.pad_token_id,
            # After a stop token generate pads; the mask must end at the stop token.
            eos_token_ids=self.eos_token_ids | set(settings.stop_token_ids),
            meta_info={"n": settings.n},
        )

    @torch.no_grad()
    def generate_ids(
        self, prompt_ids: list[list[int]], settings: SamplingSettings, max_tokens: list[int], vision=None
    ) -> list[GeneratedTurn]:
        """One sample per prompt, each cut at its own token budget; ids as sampled. `vision`:
        per prompt its images (a VisionState, workers/rollout/multi_turn_images.py)."""
        check_turn_requests(prompt_ids, settings, max_tokens, self.max_model_len)
        width = max(len(ids) for ids in prompt_ids)
        input_ids = torch.full((len(prompt_ids), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(prompt_ids), width), dtype=torch.long)
        for i, ids in enumerate(prompt_ids):
            input_ids[i, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
            attention_mask[i, width - len(ids) :] = 1
        settings = dataclasses.replace(settings, max_tokens=max(max_tokens))
        images = None if vision is None else [state.inputs() for state in vision]
        token_ids, log_probs, stopped_by_string = self._sample(input_ids, attention_mask, settings, images)
        stops = self.eos_token_ids | set(settings.stop_token_ids)
        turns = []
        for i, (ids, budget) in enumerate(zip(token_ids, max_tokens)):
            end = next((j + 1 for j, tok in enumerate(ids) if tok in stops), None)
            stopped = end is not None or stopped_by_string[i]
            end = len(ids) if end is None else end
            if end > budget:
                end, stopped = budget, False
            probs = log_probs[i][:end] if log_probs is not None else [0.0] * end
            turns.append(GeneratedTurn(ids[:end], probs, "stop" if stopped else "length"))
        return turns

    def _stop_string_lengths(self, sequences: torch.Tensor, prompt_len: int) -> list[int]:
        """Per row, the number of generated tokens up to and including the one that
        completed a stop string (all of them when none did). generate pads a row after it
        stops, and with pad == EOS that padding would read as a generated EOS; the same
        criteria generate applied, run again step by step over the output, says where each
        row stopped."""
        num_rows, generated = sequences.shape[0], sequences.shape[1] - prompt_len
        lengths = [generated] * num_rows
        if self.stop_criteria is None:
            return lengths
        open_rows = set(range(num_rows))
        for step in range(1, generated + 1):
            done = self.stop_criteria(sequences[:, : prompt_len + step], None)
            for row in [r for r in open_rows if bool(done[r])]:
                lengths[row] = step
                open_rows.discard(row)
            if not open_rows:
                break
        return lengths
