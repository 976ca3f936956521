"""What a reward model reads for one trajectory: the policy's own token ids when the reward
model shares the policy's tokenizer and chat template, else the conversation decoded with
the policy's tokenizer and written again in the reward model's chat template. The FSDP
reward-model worker and the reward loop's engine both build their inputs here, so the two
score the same tokens."""

from __future__ import annotations


def needs_retemplate(input_tokenizer, rm_tokenizer) -> bool:
    """Whether the policy's ids must be re-templated for the reward model (another chat
    template or another vocabulary); False when no input tokenizer is named."""
    return input_tokenizer is not None and (
        input_tokenizer.chat_template != rm_tokenizer.chat_template
        or input_tokenizer.get_vocab() != rm_tokenizer.get_vocab()
    )


def retemplated_ids(
    input_tokenizer, rm_tokenizer, prompt_ids, response_ids, raw_prompt=None, max_length: int | None = None
) -> list[int]:
    """The conversation (the row's raw_prompt messages, else the decoded prompt as one user
    turn, then the decoded response as the assistant's) in the reward model's chat template,
    cut to its last `max_length` tokens."""
    prompt_text = input_tokenizer.decode(list(prompt_ids), skip_special_tokens=True)
    chat = list(raw_prompt) if raw_prompt is not None else [{"role": "user", "content": prompt_text}]
    response_text = input_tokenizer.decode(list(response_ids), skip_special_tokens=True)
    chat = chat + [{"role": "assistant", "content": response_text}]
    ids = rm_tokenizer.apply_chat_template(chat, tokenize=True)
    ids = list(ids["input_ids"]) if hasattr(ids, "keys") else list(ids)
    return ids[-int(max_length) :] if max_length else ids
