"""The one place the rollout's sampling settings (workers/rollout/base.SamplingSettings)
become a vLLM `SamplingParams`: for the batched engine calls (vllm_rollout.py), the agent
loops (agent_rollout.py) and the OpenAI-compatible endpoint (openai_server.py) alike."""

from __future__ import annotations

from workers.rollout.base import ROLLOUT, SamplingSettings


def vllm_sampling_params(settings: SamplingSettings):
    """The vLLM `SamplingParams` of one call; a value vLLM refuses raises ValueError
    naming the rollout key. Greedy settings ask for one sample (see repeat_greedy)."""
    from vllm import SamplingParams
    from vllm.exceptions import VLLMValidationError

    try:
        return SamplingParams(
            n=1 if settings.greedy else settings.n,  # vLLM refuses greedy n > 1: the caller repeats the one
            temperature=settings.temperature,
            top_p=settings.top_p,
            top_k=settings.top_k,
            min_p=settings.min_p,
            repetition_penalty=settings.repetition_penalty,
            presence_penalty=settings.presence_penalty,
            frequency_penalty=settings.frequency_penalty,
            stop=list(settings.stop) or None,
            stop_token_ids=list(settings.stop_token_ids) or None,
            ignore_eos=settings.ignore_eos,
            max_tokens=settings.max_tokens,
            logprobs=0,
            # Responses are kept as token ids; text is only needed to find stop strings.
            detokenize=bool(settings.stop),
        )
    except (VLLMValidationError, ValueError, TypeError) as e:
        # vLLM's parameter names are the rollout keys (val_kwargs for validation calls).
        raise ValueError(f"{ROLLOUT}: vLLM refuses the sampling settings: {e}") from e
