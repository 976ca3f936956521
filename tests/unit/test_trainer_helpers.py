"""Small driver-side helpers of hybrid/trainer.py and the device switch."""

from __future__ import annotations

import numpy as np
import pytest

from hybrid.rollouts import numeric_columns


def test_numeric_extra_info_columns_become_metrics_and_others_are_left_out():
    extra = {
        "acc": [1, 0, 1.0],
        "format_ok": np.array([True, False, True]),  # bools are flags, not quantities
        "pred": ["3", "4", "5"],
        "short": [1.0],  # not one value per row
    }
    assert numeric_columns(extra, 3) == {"acc": [1.0, 0.0, 1.0]}


def test_select_device_cpu_hides_gpus_and_rejects_unknown(monkeypatch):
    from workers import device

    monkeypatch.delenv("HYBRID_DEVICE", raising=False)
    device.select_device("cpu")
    try:
        assert device.get_device_name() == "cpu" and device.get_dist_backend() == "gloo"
        with pytest.raises(ValueError, match="trainer.device='tpu' is not one of auto, cuda, cpu"):
            device.select_device("tpu")
    finally:
        monkeypatch.delenv("HYBRID_DEVICE", raising=False)
        device.is_cuda_available.cache_clear()


def test_summary_names_the_held_out_set_by_its_distinct_count(tmp_path, capsys):
    from hybrid.config import build_config
    from hybrid.console import print_summary

    config = build_config([f"trainer.default_local_dir={tmp_path}"])
    before = {
        "val-core/arithmetic/reward/mean@1": 0.25,
        "val-aux/num_prompts": 200.0,
        "val-aux/num_distinct_prompts": 103.0,
    }
    after = {"val-core/arithmetic/reward/mean@1": 0.75}
    print_summary(config, {"steps": 3, "minutes": 1.5, "val_before": before, "val_after": after})
    out = capsys.readouterr().out
    assert (
        "validation accuracy (greedy) on 103 distinct held-out prompts (200 rows): before 0.250 -> after 0.750" in out
    )
    before["val-aux/num_prompts"] = 103.0
    print_summary(config, {"steps": 3, "minutes": 1.5, "val_before": before, "val_after": after})
    out = capsys.readouterr().out
    assert "on 103 distinct held-out prompts: before 0.250" in out and "finished 3 steps in 1.5 min" in out
    print_summary(config, {"steps": 1, "minutes": 0.8, "val_before": before, "val_after": after})
    assert "hybrid: finished 1 step in 0.8 min" in capsys.readouterr().out


def test_rays_token_auth_notice_is_dropped_and_its_other_warnings_kept(caplog):
    import logging

    from hybrid.roles import RAY_AUTH_LOGGER
    from workers.engine_logs import HarmlessWarnings, drop_harmless_warnings

    logger = logging.getLogger(RAY_AUTH_LOGGER)
    drop_harmless_warnings(logger)
    try:
        with caplog.at_level(logging.WARNING, logger=RAY_AUTH_LOGGER):
            logger.warning(
                "Token authentication is enabled for this Ray cluster. Set RAY_AUTH_MODE=disabled to opt out."
            )
            logger.warning("Token authentication is disabled for this Ray cluster. Anyone with network access ...")
    finally:
        logger.filters = [f for f in logger.filters if not isinstance(f, HarmlessWarnings)]
    assert [r.getMessage()[:40] for r in caplog.records] == ["Token authentication is disabled for thi"]


def test_header_says_what_runs_and_where_files_go(tmp_path, capsys):
    from types import SimpleNamespace

    from hybrid.config import build_config
    from hybrid.console import print_header

    config = build_config(
        [f"trainer.default_local_dir={tmp_path}", "actor_rollout_ref.model.path=/models/SmolLM2-135M/"]
    )
    loaders = SimpleNamespace(
        train_dataloader=SimpleNamespace(dataset=range(2000)),
        validation=SimpleNamespace(dataloader=SimpleNamespace(dataset=range(200))),
        total_training_steps=15,
    )
    print_header(config, loaders)
    assert capsys.readouterr().out.splitlines() == [
        "hybrid: grpo on SmolLM2-135M | cpu x 1 | rollout vllm, n=4",
        "  data: 2000 training rows, 200 validation rows | 15 steps of 8 prompts | validation every 5 steps",
        f"  run folder: {tmp_path} (metrics, engine logs, checkpoints)",
    ]


def _grouped_batch(prompt_lens: list[int], response_lens: list[list[int]]):
    """Rows of equal-size groups (one uid each), left-padded prompts, right-padded responses."""
    import numpy as np
    import torch

    from protocol.data_proto import DataProto

    width, response_width = max(prompt_lens), max(max(r) for r in response_lens)
    masks, uids = [], []
    for g, (p, responses) in enumerate(zip(prompt_lens, response_lens)):
        for r in responses:
            masks.append([0] * (width - p) + [1] * (p + r) + [0] * (response_width - r))
            uids.append(f"u{g}")
    mask = torch.tensor(masks)
    ids = torch.arange(mask.numel()).view_as(mask)
    return DataProto.from_dict(
        tensors={"attention_mask": mask, "input_ids": ids, "responses": ids[:, width:]},
        non_tensors={"uid": np.array(uids, dtype=object)},
    )


def test_balance_batch_keeps_prompt_groups_on_one_rank_and_counts_their_prompt_once():
    from hybrid.batch_ops import balance_batch

    # 4 groups of 2: long prompts with short responses vs short prompts with long responses
    batch = _grouped_batch([30, 30, 2, 2], [[1, 1], [1, 1], [20, 20], [20, 20]])
    metrics = balance_batch(batch, world_size=2, keep_groups=True)
    uids = list(batch.non_tensor_batch["uid"])
    ranks = [set(uids[:4]), set(uids[4:])]
    assert all(len(r) == 2 for r in ranks)  # two whole groups per rank
    # counted prompt-once the groups cost 32, 32, 42, 42: each rank gets one of each kind
    assert all(any(u in r for u in ("u0", "u1")) and any(u in r for u in ("u2", "u3")) for r in ranks)
    assert metrics["perf/balance_max_min_ratio"] == 1.0


def test_balance_batch_falls_back_to_rows_when_groups_cannot_split_evenly():
    from hybrid.batch_ops import balance_batch

    batch = _grouped_batch([3, 5, 7], [[1, 2], [3, 4], [5, 6]])  # 3 groups over 2 ranks
    balance_batch(batch, world_size=2, keep_groups=True)
    lens = batch.batch["attention_mask"].sum(-1).tolist()
    assert sorted(lens) == [4, 5, 8, 9, 12, 13] and abs(sum(lens[:3]) - sum(lens[3:])) <= 3


def test_rows_by_uid_groups_rows_in_order_and_filtering_keeps_varying_groups():
    from hybrid.batch_ops import kept_group_indices, rows_by_uid

    uids = np.array(["b", "a", "b", "c", "a"], dtype=object)
    assert rows_by_uid(uids) == {"b": [0, 2], "a": [1, 4], "c": [3]}
    # b varies, a does not, c is a group of one (kept: nothing to compare it with)
    assert kept_group_indices(uids, np.array([1.0, 0.0, 0.0, 1.0, 0.0])) == [0, 2, 3]


def _validation_console(config, tokenizer, tmp_path, capsys) -> str:
    """What a validation step prints: the validation reward manager as run_ppo makes it
    scoring a batch, then the sample table (PPOTrainer.validate)."""
    from hybrid.run import val_num_examine
    from hybrid.tracking import ValidationGenerationsLogger
    from reward.loader import load_reward_manager
    from tests.unit.test_reward_manager import make_batch

    data, _ = make_batch(tokenizer, ["= 147", "= 11"], ["147", "13"])
    val_reward_fn = load_reward_manager(config, tokenizer, num_examine=val_num_examine(config))
    scores = val_reward_fn(data, return_dict=True)["reward_tensor"].sum(-1).tolist()
    prompts = tokenizer.batch_decode(data.batch["prompts"], skip_special_tokens=True)
    responses = tokenizer.batch_decode(data.batch["responses"], skip_special_tokens=True)
    k = config.trainer.log_val_generations
    if k:
        ValidationGenerationsLogger(tmp_path).log(
            config.trainer.logger, list(zip(prompts, responses, scores))[:k], step=0
        )
    return capsys.readouterr().out


def test_validation_console_shows_the_first_sample_once(tmp_path, tokenizer, capsys):
    from hybrid.config import build_config

    # The default: console logger and a table of 4 samples; verl's printed example would repeat its first row.
    config = build_config([f"trainer.default_local_dir={tmp_path}"])
    out = _validation_console(config, tokenizer, tmp_path, capsys)
    assert out.startswith("validation samples at step 0:\n")
    assert out.count("= 147") == 1 and "[response]" not in out and "[prompt]" not in out
    # No table (verl's log_val_generations=0, or no console logger): verl's one example per data source.
    for override in ("trainer.log_val_generations=0", "trainer.logger=[file]"):
        config = build_config([f"trainer.default_local_dir={tmp_path}", override])
        out = _validation_console(config, tokenizer, tmp_path, capsys)
        assert "validation samples" not in out and out.count("[response]") == 1 and out.count("= 147") == 1


def test_a_steps_console_line_comes_before_its_checkpoint_messages(tmp_path, capsys):
    import json
    from types import SimpleNamespace

    from hybrid.tracking import Tracking
    from hybrid.trainer import PPOTrainer

    trainer = object.__new__(PPOTrainer)  # the end of a step only: no workers, no data
    trainer.tracker = Tracking("p", "e", default_backend=["console", "file"], local_dir=tmp_path)
    trainer.actor_rollout_wg = SimpleNamespace(memory_stats=lambda: [{"rss_gb": 1.0}])
    trainer.state, trainer.history = SimpleNamespace(global_step=30), []

    def after_step(metrics):  # what a due save at the last step prints and records
        print("checkpoint: saved global_step_30 in 3.17 s")
        print("checkpoint: merged the final actor into global_step_30/actor/huggingface in 5.1 s")
        metrics["timing_s/save_checkpoint"] = 3.17

    trainer.after_step = after_step
    trainer.log_step({"critic/score/mean": 0.906, "val-core/arithmetic/reward/mean@1": 0.68, "timing_s/step": 7.3})
    trainer.tracker.finish()
    assert capsys.readouterr().out.splitlines() == [
        "step 30 | score 0.906 | val 0.68 | 7.3 s",
        "checkpoint: saved global_step_30 in 3.17 s",
        "checkpoint: merged the final actor into global_step_30/actor/huggingface in 5.1 s",
    ]
    # The file gets the whole step once, the save's time and the memory measured after it included.
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 1 and records[0]["step"] == 30
    assert records[0]["timing_s/save_checkpoint"] == 3.17 and records[0]["perf/worker_cpu_memory_rss_gb"] == 1.0
    assert trainer.history[0]["timing_s/save_checkpoint"] == 3.17


def test_checkpoint_lines_start_on_a_line_of_their_own_under_the_progress_bar(capsys):
    """A save at the last step printed `training: 97%|...| 29/30 [...]checkpoint: saved ...`:
    the checkpoint's lines go through tqdm now, which clears the bar first."""
    import sys

    from tqdm import tqdm

    from hybrid.checkpoint_folders import say

    bar = tqdm(total=30, desc="training", file=sys.stdout, ascii=True)  # one terminal: bar and lines share it
    bar.update(29)
    say("checkpoint: saved global_step_30 in 3.17 s")
    bar.close()
    shown = [line.split("\r")[-1] for line in capsys.readouterr().out.split("\n")]  # what a terminal leaves visible
    assert "checkpoint: saved global_step_30 in 3.17 s" in shown, shown
