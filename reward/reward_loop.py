"""The reward loop's worker: scores one trajectory at a time, many at once.

`RewardLoopWorker.score` takes one finished trajectory (`trajectory_sample`: its prompt and
response ids and its row's fields) and returns its scores: the reward function's (the
configured reward manager on that one row, so the rule-based scorers, user reward files and
managers keep their meaning) and the reward model's, served by `workers/reward_engine.py`:
a classifier's value on the same tokens the FSDP reward-model worker would read
(reward/reward_model_inputs.py), or a judge's verdict parsed by reward/judge.py.

A judge that fails, times out (`reward_model.judge.timeout_s`) or writes no usable verdict
ends only that trajectory's verdict: it scores `judge.invalid_score` and its `judge_status`
says why; the trainer counts them (`reward_loop/judge_<status>`). The driver
(hybrid/reward_loop.py) runs `num_workers` of these as Ray actors; the agent loops hand each
trajectory to one as soon as it finishes (workers/rollout/agent_rollout.py).

A judge limited to some domains (`reward_model.judge.domains`, ROLL's LLM-judge domain) scores
only the rows of those domains (the row's `data.reward_fn_key` column, `domain` with domains),
and only the judge: the reward function scores the other rows, the judge none of them
(`judged`; their judge_status is `not_judged`, their rm_score 0).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import urllib.request
from typing import Any

import numpy as np
import torch

from protocol.data_proto import DataProto

from .judge import ERROR, TIMEOUT, Verdict, compile_pattern, parse_verdict, render
from .reward_model_inputs import needs_retemplate, retemplated_ids

NOT_JUDGED = "not_judged"  # a row of a domain the judge does not score (reward_model.judge.domains)


def trajectory_sample(prompt_ids, response_ids, fields: dict) -> dict:
    """What the reward loop needs of one trajectory: plain lists and its row's fields."""
    return {"prompt_ids": [int(i) for i in prompt_ids], "response_ids": [int(i) for i in response_ids], **fields}


def _one_row(sample: dict, pad_token_id: int) -> DataProto:
    """The sample as a one-row batch in the reward managers' layout (prompts, responses,
    attention_mask, and its non-tensor fields)."""
    prompt, response = sample["prompt_ids"], sample["response_ids"]
    width = max(len(response), 1)
    responses = torch.full((1, width), pad_token_id, dtype=torch.long)
    responses[0, : len(response)] = torch.tensor(response, dtype=torch.long)
    mask = torch.zeros((1, len(prompt) + width), dtype=torch.long)
    mask[0, : len(prompt) + len(response)] = 1
    tensors = {
        "prompts": torch.tensor([prompt], dtype=torch.long).reshape(1, len(prompt)),
        "responses": responses,
        "attention_mask": mask,
    }
    fields = {k: v for k, v in sample.items() if k not in ("prompt_ids", "response_ids")}
    non_tensors = {}
    for key, value in fields.items():
        column = np.empty(1, dtype=object)
        column[0] = value
        non_tensors[key] = column
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors)


def judged(sample: dict, domains, domain_key: str) -> bool:
    """Whether the judge scores this row: every row when `domains` is None, else the rows whose
    `domain_key` column names one of `domains`."""
    return domains is None or str(sample.get(domain_key)) in domains


def load_tokenizer(path: str, trust_remote_code: bool):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


class RewardLoopWorker:
    """`config`: the whole run's config; `engine`: the reward model's engine (a Ray actor
    handle of workers/reward_engine.RewardEngine) or None; `kind`: its kind; `max_model_len`:
    its context (a classifier's input is cut to its last max_model_len tokens)."""

    def __init__(self, config, engine=None, kind: str | None = None, max_model_len: int | None = None):
        from reward.loader import load_reward_manager

        self.config = config
        self.rm = config.reward_model
        model = config.actor_rollout_ref.model
        self.tokenizer = load_tokenizer(model.tokenizer_path or model.path, model.trust_remote_code)
        self.pad_token_id = (
            self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        )
        self.manager = load_reward_manager(config, self.tokenizer, num_examine=0)
        self.engine, self.kind = engine, kind
        judge = self.rm.judge
        self.pattern = compile_pattern(judge.verdict_pattern)
        self.judge_domains = None if judge.domains is None else frozenset(judge.domains)
        self.domain_key = config.data.reward_fn_key
        self.retemplate = False
        if self.rm.enable and kind == "discriminative":
            rm_model = self.rm.model
            self.rm_tokenizer = load_tokenizer(rm_model.path, rm_model.trust_remote_code)
            self.input_tokenizer = load_tokenizer(rm_model.input_tokenizer, False) if rm_model.input_tokenizer else None
            self.retemplate = needs_retemplate(self.input_tokenizer, self.rm_tokenizer)
            self.max_model_len = int(max_model_len or self.rm.rollout.engine_max_model_len)

    def ready(self) -> bool:
        return True

    async def score(self, sample: dict, use_reward_fn: bool = True) -> dict:
        """{"score": the reward function's score or None, "rm_score": the reward model's or
        None, "extra": the reward function's extra keys, "metrics": its metrics,
        "judge_status": "ok" or why the verdict was not used, "truncated": whether the reward
        model's input was cut, "latency_s": time spent here}."""
        start = time.perf_counter()
        result: dict[str, Any] = {"score": None, "rm_score": None, "extra": {}, "metrics": {}}
        judge_row = judged(sample, self.judge_domains, self.domain_key)
        if use_reward_fn and not (self.judge_domains is not None and judge_row):
            scored = await asyncio.to_thread(self.manager, _one_row(sample, self.pad_token_id), True)
            result["score"] = float(scored["reward_tensor"].sum())
            result["extra"] = {k: v[0] for k, v in scored.get("reward_extra_info", {}).items()}
            result["metrics"] = dict(scored.get("reward_metrics", {}))
        if self.rm.enable:
            if self.kind == "discriminative":
                ids = self._classifier_ids(sample)
                result["truncated"] = len(ids) > self.max_model_len
                result["rm_score"] = float(await self.engine.classify.remote(ids[-self.max_model_len :]))
            elif judge_row:
                verdict = await self._verdict(sample)
                result["rm_score"], result["judge_status"] = verdict.score, verdict.status
            else:
                result["rm_score"], result["judge_status"] = 0.0, NOT_JUDGED
        result["latency_s"] = time.perf_counter() - start
        return result

    # ------------------------------------------------------------------ reward models
    def _classifier_ids(self, sample: dict) -> list[int]:
        if not self.retemplate:
            return sample["prompt_ids"] + sample["response_ids"]
        return retemplated_ids(
            self.input_tokenizer,
            self.rm_tokenizer,
            sample["prompt_ids"],
            sample["response_ids"],
            sample.get("raw_prompt"),
            self.rm.max_length,
        )

    def _judge_messages(self, sample: dict) -> list[dict]:
        judge = self.rm.judge
        raw = sample.get("raw_prompt")
        if judge.prompt_after is not None:
            # ROLL's LLM judge: the decoded prompt, cut after the last "user\n" when it has one.
            prompt = self.tokenizer.decode(sample["prompt_ids"], skip_special_tokens=True)
            if judge.prompt_after in prompt:
                prompt = prompt.split(judge.prompt_after)[-1].strip()
        elif raw is not None and len(raw):
            prompt = "\n".join(str(m.get("content", "")) for m in raw if m.get("role") == "user")
        else:
            prompt = self.tokenizer.decode(sample["prompt_ids"], skip_special_tokens=True)
        response = self.tokenizer.decode(sample["response_ids"], skip_special_tokens=True)
        truth = (sample.get("reward_model") or {}).get("ground_truth")
        messages = [{"role": "system", "content": judge.system_prompt}] if judge.system_prompt else []
        return messages + [{"role": "user", "content": render(judge.prompt_template, prompt, response, truth)}]

    async def _verdict(self, sample: dict) -> Verdict:
        judge = self.rm.judge
        messages = self._judge_messages(sample)
        try:
            if judge.base_url:
                text = await asyncio.wait_for(asyncio.to_thread(self._ask_server, messages), judge.timeout_s)
            else:
                stop = list(judge.stop or []) or None
                call = self.engine.judge.remote(messages, judge.temperature, stop, judge.top_p, judge.top_k)
                text = await asyncio.wait_for(call, judge.timeout_s)
        except TimeoutError:
            return Verdict(judge.invalid_score, TIMEOUT)
        except Exception as error:  # one judge call's failure ends only this verdict; counted and shown
            return Verdict(judge.invalid_score, ERROR, f"{type(error).__name__}: {error}")
        labels = dict(judge.verdict_labels) if judge.verdict_labels else None
        return parse_verdict(text, self.pattern, judge.min_score, judge.max_score, judge.invalid_score, labels)

    def _ask_server(self, messages: list[dict]) -> str:
        """One chat completion from judge.base_url (an OpenAI-compatible server)."""
        judge = self.rm.judge
        body = {
            "model": judge.model or self.rm.model.path,
            "messages": messages,
            "temperature": judge.temperature,
            "top_p": judge.top_p,
            "max_tokens": int(self.rm.rollout.response_length),
        }
        if judge.top_k > 0:  # not an OpenAI field: sent only when set (vLLM's and SGLang's servers read it)
            body["top_k"] = judge.top_k
        if judge.stop:
            body["stop"] = list(judge.stop)
        headers = {"Content-Type": "application/json"}
        if judge.api_key_env:
            headers["Authorization"] = f"Bearer {os.environ.get(judge.api_key_env, '')}"
        request = urllib.request.Request(
            judge.base_url.rstrip("/") + "/chat/completions", json.dumps(body).encode(), headers, method="POST"
        )
        with urllib.request.urlopen(request, timeout=judge.timeout_s) as response:
            reply = json.loads(response.read())
        return reply["choices"][0]["message"]["content"] or ""
