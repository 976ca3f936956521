"""Multi-domain batches (hybrid/domains.py) against hand-computed batches and against ROLL's own
drawing loop (its scheduler's get_next_dataset_item, copied below as the reference), and the
per-domain scorers (reward/domain_scorers.py)."""

from __future__ import annotations

import pickle
import random

import pytest

from hybrid.data_loader import StatefulDataLoader
from hybrid.domains import (
    DomainError,
    DomainQuotaSampler,
    assign_domains,
    check_domain_settings,
    domain_quotas,
)
from protocol.config_schema import Problems
from reward.domain_scorers import DomainScorers


def test_quotas_follow_rolls_rounding_and_the_last_domain_takes_the_rest():
    # ROLL's qwen3-8B rlvr_config.yaml: 64 prompts, 0.4/0.3/0.1/0.1/0.1 -> int(25.6)=25, int(19.2)=19, 6, 6, rest 8
    probs = {"math_rule": 0.4, "code_sandbox": 0.3, "llm_judge": 0.1, "crossthinkqa": 0.1, "ifeval": 0.1}
    assert domain_quotas(probs, 64) == {
        "math_rule": 25,
        "code_sandbox": 19,
        "llm_judge": 6,
        "crossthinkqa": 6,
        "ifeval": 8,
    }
    # int() of the float product, as ROLL: 0.29 * 100 is 28.999999999999996 -> 28; the last's 0.5 is not read
    assert domain_quotas({"a": 0.29, "b": 0.5}, 100) == {"a": 28, "b": 72}
    with pytest.raises(DomainError, match=r"the domains before 'c' take 12 prompts, more than a batch of 10"):
        domain_quotas({"a": 0.6, "b": 0.6, "c": 0.1}, 10)
    with pytest.raises(DomainError, match="lists 1 domain"):
        domain_quotas({"a": 1.0}, 8)


def test_rows_take_their_domain_column_then_their_tag_then_the_default():
    rows = [{"tag": "gsm8k"}, {"tag": "kod", "domain": "math_rule"}, {"tag": "other"}, {"tag": "kod"}, {}]
    tags = {"math_rule": ["gsm8k"], "code_sandbox": ["kod"]}
    assert assign_domains(rows, tags, "math_rule") == [
        "math_rule",
        "math_rule",
        "math_rule",
        "code_sandbox",
        "math_rule",
    ]
    assert [r["domain"] for r in rows] == ["math_rule", "math_rule", "math_rule", "code_sandbox", "math_rule"]
    with pytest.raises(DomainError) as err:
        assign_domains([{"tag": "gsm8k"}, {"tag": "x"}], tags, None, "training")
    assert str(err.value) == (
        "training row 1: no 'domain' column and its tag 'x' is in no data.domain_tags list; add the tag to a domain "
        "or set data.default_domain"
    )
    with pytest.raises(DomainError, match="tag 'kod' is listed by both 'a' and 'b'"):
        assign_domains([], {"a": ["kod"], "b": ["kod"]}, None)


# a: rows 0, 2, 4 (3 rows); b: rows 1, 3, 5, 6, 7 (5 rows); c: row 8 (not in the quotas, never drawn)
DOMAINS = ["a", "b", "a", "b", "a", "b", "b", "b", "c"]


def test_in_order_batches_hold_each_domains_quota_and_run_on_into_its_next_epoch():
    sampler = DomainQuotaSampler(DOMAINS, {"a": 2, "b": 1}, shuffle=False)
    assert len(sampler) == 8  # rows of the quota domains: a loader epoch is 8 // 3 = 2 batches
    # a's stream: 0 2 4 | 0 2 4 | 0 2 ...; b's: 1 3 5 6 7 | ...
    assert sampler.indices_for_epoch(0) == [0, 2, 1, 4, 0, 3]
    assert sampler.indices_for_epoch(1) == [2, 4, 5, 0, 2, 6]
    assert sampler.indices_for_epoch(2) == [4, 0, 7, 2, 4, 1]


def _roll_stream(rows: int, seed: int, count: int) -> list[int]:
    """ROLL's DynamicSamplingScheduler.get_next_dataset_item (generate_scheduler.py), verbatim in
    its random calls: the global random module, seeded by seed + epoch, shuffling in place."""
    indices, epoch, it, out = list(range(rows)), 0, None, []
    for _ in range(count):
        if it is None:
            random.seed(seed + epoch)
            random.shuffle(indices)
            it = iter(indices)
        try:
            out.append(next(it))
        except StopIteration:
            epoch += 1
            random.seed(seed + epoch)
            random.shuffle(indices)
            it = iter(indices)
            out.append(next(it))
    return out


def test_shuffled_batches_draw_what_rolls_schedulers_draw():
    state = random.getstate()
    try:
        a_rows, b_rows = [0, 2, 4], [1, 3, 5, 6, 7]
        expected_a = [a_rows[i] for i in _roll_stream(3, 42, 2 * 2 * 4)]  # 4 loader epochs of 2 batches
        expected_b = [b_rows[i] for i in _roll_stream(5, 42, 1 * 2 * 4)]
    finally:
        random.setstate(state)
    sampler = DomainQuotaSampler(DOMAINS, {"a": 2, "b": 1}, shuffle=True, seed=42)
    drawn = [i for epoch in range(4) for i in sampler.indices_for_epoch(epoch)]
    batches = [drawn[k : k + 3] for k in range(0, len(drawn), 3)]
    assert [i for b in batches for i in b[:2]] == expected_a
    assert [b[2] for b in batches] == expected_b
    # a later epoch asked first (a resumed run) gives the same order as going through the earlier ones
    assert DomainQuotaSampler(DOMAINS, {"a": 2, "b": 1}, seed=42).indices_for_epoch(3) == drawn[18:]


def test_a_domain_without_rows_or_with_a_quota_over_its_rows_is_refused():
    with pytest.raises(DomainError) as err:
        DomainQuotaSampler(DOMAINS, {"a": 1, "z": 1})
    assert str(err.value) == (
        "data.domain_quotas.z: no training row has this domain (rows per domain: {'a': 3, 'b': 5, 'c': 1}); "
        "check data.domain_tags and the files' tag column"
    )
    with pytest.raises(DomainError, match=r"data.domain_quotas.a: 4 prompts per batch but the domain has 3 rows"):
        DomainQuotaSampler(DOMAINS, {"a": 4, "b": 1})


def test_the_resumable_loader_batches_by_quota_and_resumes_at_the_same_batch():
    rows = list(range(len(DOMAINS)))

    def loader():
        sampler = DomainQuotaSampler(DOMAINS, {"a": 2, "b": 1}, shuffle=False)
        return StatefulDataLoader(rows, 3, sampler, collate_fn=list)

    first = loader()
    assert len(first) == 2  # a loader epoch: 8 rows of the quota domains // 3
    it = iter(first)
    assert next(it) == [0, 2, 1]
    saved = first.state_dict()
    assert list(it) == [[4, 0, 3]]
    assert list(first) == [[2, 4, 5], [0, 2, 6]]  # loader epoch 1: the domains' streams go on
    resumed = loader()
    resumed.load_state_dict(saved)
    assert list(resumed) == [[4, 0, 3]]


class _Data:
    def __init__(self, **kw):
        from types import SimpleNamespace

        base = dict(
            domain_quotas={},
            domain_tags={},
            default_domain=None,
            domain_scorers={},
            domain_scorer_kwargs={},
            train_batch_size=10,
            reward_fn_key="data_source",
            custom_cls=SimpleNamespace(path=None),
        )
        base.update(kw)
        self.__dict__.update(base)


def test_domain_settings_are_checked_together():
    problems = Problems()
    check_domain_settings(_Data(domain_quotas={"a": 0.5, "b": 0.5}, domain_scorers={"a": "math"}), problems)
    assert problems == [
        "data.domain_scorers routes each row by its domain: set data.reward_fn_key=domain (it is 'data_source')",
        "data.domain_scorers names no scorer for domain(s) b of data.domain_quotas",
    ]
    problems = Problems()
    check_domain_settings(_Data(domain_tags={"a": ["x"]}), problems)
    assert problems == ["data.domain_tags is set but data.domain_quotas is empty: they are read only with quotas"]


def test_each_domains_rows_go_to_its_own_scorer():
    scorers = DomainScorers({"math_rule": "math", "school": "gsm8k"})
    boxed, hashes = "so \\boxed{4}", "so #### 4"
    assert scorers("math_rule", boxed, "4") == 1.0
    assert scorers("math_rule", hashes, "4") == 0.0  # the math scorer reads only a boxed answer
    assert scorers("school", hashes, "4") == 1.0
    assert scorers("school", boxed, "4") == 0.0  # gsm8k's strict mode reads only '#### 4'
    # a domain's own options go to its scorer only; flexible gsm8k reads the last number
    flexible = DomainScorers({"math_rule": "math", "school": "gsm8k"}, {"school": {"method": "flexible"}})
    assert flexible("school", boxed, "4") == 1.0
    assert pickle.loads(pickle.dumps(flexible))("school", boxed, "4") == 1.0
    with pytest.raises(ValueError, match="no data.domain_scorers entry for domain 'code'; domains with a scorer"):
        scorers("code", boxed, "4")
    with pytest.raises(ValueError, match=r"data.domain_scorers.x='nope': no module reward/scorers/nope.py"):
        DomainScorers({"x": "nope"})
    with pytest.raises(ValueError, match=r"reward/scorers/math.py's compute_score takes no method"):
        DomainScorers({"m": "math"}, {"m": {"method": "flexible"}})


def test_a_runs_batches_hold_the_quotas_and_each_domain_is_scored_by_its_own_scorer(tmp_path, tokenizer):
    """build_dataloaders and load_reward_manager as run_ppo calls them, on ROLL-style rows (a tag, no
    domain column): every batch 2 'school' + 3 'math_rule' prompts, and the same response scores 1
    in one domain and 0 in the other."""
    import json

    import numpy as np
    import torch

    from hybrid.config import load_config, validate_config
    from hybrid.run import build_dataloaders
    from protocol.data_proto import DataProto
    from reward.loader import load_reward_manager

    rows = [
        {"prompt": [{"role": "user", "content": f"q{i}"}], "tag": tag, "reward_model": {"ground_truth": "4"}}
        for i, tag in enumerate(["gsm8k", "aime"] * 4 + ["deepmath_103k"] * 2)
    ]
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = load_config(
        [
            f"data.train_files={path}",
            "data.val_files=null",
            "data.train_batch_size=5",
            "actor_rollout_ref.actor.ppo_mini_batch_size=5",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
            "data.reward_fn_key=domain",
            "data.domain_quotas.school=0.4",
            "data.domain_quotas.math_rule=0.4",
            "data.domain_tags.school=[gsm8k]",
            "data.default_domain=math_rule",
            "data.domain_scorers.school=gsm8k",
            "data.domain_scorers.math_rule=math",
        ]
    )
    validate_config(cfg)
    train_dl, _ = build_dataloaders(cfg, tokenizer)
    assert len(train_dl) == 2  # 10 rows of the two domains (4 school, 6 math_rule) // 5
    for batch in train_dl:
        assert list(batch["domain"]) == ["school", "school", "math_rule", "math_rule", "math_rule"]
        assert [t == "gsm8k" for t in batch["tag"]] == [True, True, False, False, False]
    manager = load_reward_manager(cfg, tokenizer, num_examine=0)
    responses = ["#### 4", "\\boxed{4}"] * 2
    ids = [tokenizer(r, add_special_tokens=False)["input_ids"] for r in responses]
    width = max(map(len, ids))
    prompt = np.zeros((4, 1), dtype=np.int64) + tokenizer.eos_token_id
    response = np.array([x + [tokenizer.pad_token_id] * (width - len(x)) for x in ids])
    mask = np.array([[1] + [1] * len(x) + [0] * (width - len(x)) for x in ids])
    data = DataProto.from_single_dict(
        {
            "prompts": torch.tensor(prompt),
            "responses": torch.tensor(response),
            "attention_mask": torch.tensor(mask),
            "domain": np.array(["school", "school", "math_rule", "math_rule"], dtype=object),
            "reward_model": np.array([{"ground_truth": "4"}] * 4, dtype=object),
        }
    )
    scores = manager(data).sum(dim=-1).tolist()
    assert scores == [1.0, 0.0, 0.0, 1.0]  # gsm8k reads '#### 4' only, math the boxed answer only


def test_advantages_per_domain_whiten_each_domains_rows_apart():
    """reinforce_plus_plus whitens returns over the batch; ROLL's multi-domain pipeline computes it per
    domain. Rows of 2 tokens, the reward on the last: domain a's rows 1 and 0, domain b's 10 and 20.
    Per domain, each pair of returns (x, y) over 4 tokens has mean (x+y)/2 and unbiased variance
    4 (d/2)^2 / 3 (d = y - x), so the rows whiten to -+sqrt(3)/2, whatever the domain's scale."""
    import dataclasses
    import math

    import numpy as np
    import torch

    from hybrid.batch_ops import clip_rewards_and_advantages
    from hybrid.config import load_config, validate_config
    from hybrid.trainer import as_typed
    from protocol.data_proto import DataProto

    cfg = load_config(["algorithm.adv_estimator=reinforce_plus_plus"])
    validate_config(cfg)
    algorithm = as_typed(cfg).algorithm
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0], [0.0, 10.0], [0.0, 20.0]])

    def batch(domains):
        return DataProto.from_single_dict(
            {
                "token_level_rewards": rewards.clone(),
                "response_mask": torch.ones(4, 2),
                "uid": np.array(["p", "q", "r", "s"], dtype=object),
                "domain": np.array(domains, dtype=object),
            }
        )

    split = batch(["a", "b", "a", "b"])  # interleaved: the rows go back where they came from
    split.batch["token_level_rewards"] = rewards[[0, 2, 1, 3]]
    clip_rewards_and_advantages(split, dataclasses.replace(algorithm, advantages_per_domain=True), {})
    h = math.sqrt(3) / 2
    expected = torch.tensor([[h, h], [-h, -h], [-h, -h], [h, h]])[[0, 2, 1, 3]]
    assert torch.allclose(split.batch["advantages"], expected, atol=1e-4)
    assert torch.equal(split.batch["returns"], rewards[[0, 2, 1, 3]].flip(-1).cumsum(-1).flip(-1))
    whole = batch(["a", "a", "b", "b"])
    clip_rewards_and_advantages(whole, algorithm, {})  # over the whole batch: domain b's scale dominates
    assert whole.batch["advantages"][0, 0] < -0.5 and whole.batch["advantages"][1, 0] < -0.5
