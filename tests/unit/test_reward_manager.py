"""Reward managers on hand-built batches: where the score lands, extra info from dict
scores, loud failures naming the sample, DAPO's overlong penalty, batch scoring, and the
prime pool's time limits (counted, never silent)."""

from __future__ import annotations

import textwrap
import time

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from protocol.data_proto import DataProto
from reward.loader import get_custom_reward_fn
from reward.manager import (
    BatchRewardManager,
    DAPORewardManager,
    NaiveRewardManager,
    PrimeRewardManager,
    RewardFunctionError,
)

P, R = 8, 10


def make_batch(tokenizer, responses, truths, sources=None, prompts=None):
    """prompts left padded to P, responses (each ending in eos) right padded to R."""
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    n = len(responses)
    sources = sources or ["arithmetic"] * n
    prompts = prompts or [f"What is {i}?" for i in range(n)]
    prompt_ids = torch.full((n, P), pad, dtype=torch.long)
    response_ids = torch.full((n, R), pad, dtype=torch.long)
    mask = torch.zeros((n, P + R), dtype=torch.long)
    lengths = []
    for i, (prompt, response) in enumerate(zip(prompts, responses)):
        p = tokenizer.encode(prompt, add_special_tokens=False)[-P:]
        r = (tokenizer.encode(response, add_special_tokens=False) + [eos])[:R]
        prompt_ids[i, P - len(p) :] = torch.tensor(p)
        response_ids[i, : len(r)] = torch.tensor(r)
        mask[i, P - len(p) : P] = 1
        mask[i, P : P + len(r)] = 1
        lengths.append(len(r))
    data = DataProto.from_dict(
        tensors={
            "prompts": prompt_ids,
            "responses": response_ids,
            "input_ids": torch.cat([prompt_ids, response_ids], dim=1),
            "attention_mask": mask,
        },
        non_tensors={
            "data_source": np.array(sources, dtype=object),
            "reward_model": np.array([{"style": "rule", "ground_truth": t} for t in truths], dtype=object),
            "extra_info": np.array([{"index": i} for i in range(n)], dtype=object),
        },
    )
    return data, lengths


REWARD_FILE = """
    import math
    import signal
    import time

    def per_sample(data_source, solution_str, ground_truth, extra_info=None):
        if "nan" in solution_str:
            return math.nan
        if "text" in solution_str:
            return "high"
        if "boom" in solution_str:
            return 1 / 0
        if "nodict" in solution_str:
            return {"acc": True}
        if "slow" in solution_str:
            time.sleep(30)
        if "hang" in solution_str:
            # Blocks the alarm, like a long C call would: only killing the process helps.
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
            time.sleep(60)
        if "dict" in solution_str:
            return {"score": 0.5, "acc": True, "pred": solution_str}
        return float(solution_str.strip().split()[-1] == ground_truth)

    def per_batch(data_sources, solution_strs, ground_truths, extra_infos, scale=1.0):
        return [scale * float(s.strip().split()[-1] == g) for s, g in zip(solution_strs, ground_truths)]

    def short_batch(data_sources, solution_strs, ground_truths, extra_infos):
        return [1.0]
"""


@pytest.fixture(scope="module")
def reward_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("reward") / "rewards.py"
    path.write_text(textwrap.dedent(REWARD_FILE))
    return path


def load_fn(path, name, manager="naive", **fn_kwargs):
    config = OmegaConf.create(
        {
            "reward_model": {"reward_manager": manager},
            "custom_reward_function": {"path": str(path), "name": name, "reward_kwargs": fn_kwargs},
        }
    )
    return get_custom_reward_fn(config)


def test_score_lands_on_the_last_valid_response_token(tokenizer):
    responses = ["3 + 5 = 8", "12", "7 + 1 = 9 !", "5 5 5 5 5 5 5 5 5 5 5 5"]
    data, lengths = make_batch(tokenizer, responses, ["8", "12", "8", "5"])
    assert len(set(lengths)) == 4 and lengths[3] == R  # the last one is cut at R, no eos
    reward = NaiveRewardManager(tokenizer, num_examine=0)(data)
    assert reward.dtype == torch.float32 and reward.shape == (4, R)
    expected = torch.zeros(4, R)
    expected[0, lengths[0] - 1] = 1.0
    expected[1, lengths[1] - 1] = 1.0  # sample 2 is wrong: 0 everywhere
    expected[3, R - 1] = 1.0
    assert torch.equal(reward, expected)
    assert torch.equal(NaiveRewardManager(tokenizer, num_examine=0)(data, return_dict=True)["reward_tensor"], expected)


def test_dict_scores_give_extra_info_and_num_examine_prints(tokenizer, reward_file, capsys):
    fn = load_fn(reward_file, "per_sample")
    data, lengths = make_batch(tokenizer, ["a dict", "x 4", "y 5"], ["1", "4", "6"], sources=["s1", "s1", "s2"])
    out = NaiveRewardManager(tokenizer, num_examine=1, compute_score=fn)(data, return_dict=True)
    assert out["reward_tensor"][0, lengths[0] - 1] == 0.5
    assert out["reward_tensor"][1, lengths[1] - 1] == 1.0
    assert out["reward_tensor"][2].abs().sum() == 0.0
    # Every list has one entry per sample; samples that returned a number leave None.
    assert out["reward_extra_info"] == {
        "score": [0.5, None, None],
        "acc": [True, None, None],
        "pred": ["a dict", None, None],
    }
    printed = capsys.readouterr().out
    assert printed.count("[response]") == 2  # one per data source
    assert "[prompt] What is 0?" in printed and "[ground_truth] 6" in printed


@pytest.mark.parametrize(
    "response,message",
    [
        (
            "nan",
            r"per_sample in .*rewards.py on sample 1 \(data_source='arithmetic'\) returned nan; scores must be finite",
        ),
        (
            "text",
            r"per_sample in .*rewards.py on sample 1 \(data_source='arithmetic'\) returned str 'high'; "
            r"a score must be a number",
        ),
        (
            "boom",
            r"reward function per_sample in .*rewards.py raised on sample 1 \(data_source='arithmetic'\): "
            r"ZeroDivisionError",
        ),
        ("nodict", r"sample 1 .* returned a dict without 'score' \(keys: \['acc'\]\)"),
    ],
)
def test_bad_scores_fail_loudly_naming_the_sample(tokenizer, reward_file, response, message):
    fn = load_fn(reward_file, "per_sample")
    data, _ = make_batch(tokenizer, ["ok 1", response], ["1", "1"])
    with pytest.raises(RewardFunctionError, match=message):
        NaiveRewardManager(tokenizer, num_examine=0, compute_score=fn)(data)


def test_unknown_data_source_with_the_default_scorer(tokenizer):
    data, _ = make_batch(tokenizer, ["1", "2"], ["1", "2"], sources=["arithmetic", "mystery/set"])
    with pytest.raises(
        RewardFunctionError,
        match=r"raised on sample 1 \(data_source='mystery/set'\): ValueError: no default scorer for "
        r"data_source 'mystery/set'; known data sources: openai/gsm8k",
    ):
        NaiveRewardManager(tokenizer, num_examine=0)(data)


def test_dapo_overlong_penalty_by_hand(tokenizer):
    # max_resp_len 10, buffer 4: lengths up to 6 are free, then -0.5 * (len - 6) / 4.
    responses = ["1", "2 2 2 2", "3 3 3 3 3 3 3 3 3 3 3"]
    data, lengths = make_batch(tokenizer, responses, ["1", "2", "3"])
    manager = DAPORewardManager(
        tokenizer, 0, max_resp_len=R, overlong_buffer={"enable": True, "len": 4, "penalty_factor": 0.5, "log": True}
    )
    out = manager(data, return_dict=True)
    assert lengths == [2, 8, 10]  # with the eos token
    penalties = [0.0, -0.5 * 2 / 4, -0.5 * 4 / 4]
    for i, n in enumerate(lengths):
        assert out["reward_tensor"][i, n - 1].item() == pytest.approx(1.0 + penalties[i])
    assert out["reward_extra_info"]["overlong_reward"] == pytest.approx(penalties)
    assert out["reward_extra_info"]["overlong"] == [p < 0 for p in penalties]
    # Disabled: plain scores.
    plain = DAPORewardManager(tokenizer, 0, max_resp_len=R, overlong_buffer={"enable": False})(data)
    assert [plain[i, n - 1].item() for i, n in enumerate(lengths)] == [1.0, 1.0, 1.0]


def test_batch_manager_gets_lists(tokenizer, reward_file):
    data, lengths = make_batch(tokenizer, ["so 4", "so 5"], ["4", "4"])
    manager = BatchRewardManager(
        tokenizer, 0, compute_score=load_fn(reward_file, "per_batch", manager="batch"), scale=2.0
    )
    reward = manager(data)
    assert reward[0, lengths[0] - 1] == 2.0 and reward[1].abs().sum() == 0
    short = BatchRewardManager(tokenizer, 0, compute_score=load_fn(reward_file, "short_batch", manager="batch"))
    with pytest.raises(RewardFunctionError, match="short_batch in .*rewards.py returned 1 scores for 2 samples"):
        short(data)
    # Without a custom function the default scorer runs over the lists.
    default = BatchRewardManager(tokenizer, 0)(make_batch(tokenizer, ["1 + 3 = 4"], ["4"])[0])
    assert default.sum() == 1.0


def test_prime_counts_timeouts_and_crashes(tokenizer, reward_file, capsys):
    fn = load_fn(reward_file, "per_sample")
    manager = PrimeRewardManager(tokenizer, 0, compute_score=fn, num_processes=2, timeout_s=1.0)
    try:
        data, lengths = make_batch(tokenizer, ["ok 1", "slow 1", "boom", "ok 2", "a dict"], ["1", "1", "1", "2", "1"])
        start = time.monotonic()
        out = manager(data, return_dict=True)
        assert time.monotonic() - start < 25  # the 30 s sleep was cut at 1 s
        scores = [out["reward_tensor"][i, n - 1].item() for i, n in enumerate(lengths)]
        assert scores == [1.0, 0.0, 0.0, 1.0, 0.5]
        assert out["reward_metrics"] == {"reward/timeouts": 1.0, "reward/errors": 1.0}
        assert manager.last_metrics == out["reward_metrics"]
        assert out["reward_extra_info"]["acc"] == [None, None, None, None, True]
        printed = capsys.readouterr().out
        assert "1 samples ran past 1.0s" in printed and "sample 2" in printed and "ZeroDivisionError" in printed
        # A bad return value is still an error in prime mode, not a silent zero.
        with pytest.raises(RewardFunctionError, match=r"sample 0 .* returned nan"):
            manager(make_batch(tokenizer, ["nan"], ["1"])[0])
    finally:
        manager.close()


def test_prime_survives_a_worker_stuck_beyond_the_alarm(tokenizer, reward_file):
    fn = load_fn(reward_file, "per_sample")
    manager = PrimeRewardManager(tokenizer, 0, compute_score=fn, num_processes=2, timeout_s=1.0, hang_grace_s=1.0)
    try:
        data, lengths = make_batch(tokenizer, ["ok 1", "hang"], ["1", "1"])
        start = time.monotonic()
        with pytest.warns(UserWarning, match="terminating the pool"):
            out = manager(data, return_dict=True)
        assert time.monotonic() - start < 40
        assert out["reward_tensor"][0, lengths[0] - 1] == 1.0
        assert out["reward_metrics"] == {"reward/timeouts": 1.0, "reward/errors": 0.0}
        # The next call gets a fresh pool.
        again = manager(make_batch(tokenizer, ["ok 3"], ["3"])[0], return_dict=True)
        assert again["reward_tensor"].sum() == 1.0 and again["reward_metrics"]["reward/timeouts"] == 0.0
    finally:
        manager.close()
