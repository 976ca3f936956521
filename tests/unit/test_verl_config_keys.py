"""Every key of verl's current ppo_trainer config (tests/data/peer_config_keys.json, section
verl -> ppo_trainer: the leaves of verl's _generated_ppo_trainer.yaml with their defaults) is known
to hybrid: composed at verl's default, or refused at start with the reason; the keys of
hybrid/config/verl_keys.py are read under hybrid's names, accepted with no effect (named in one
line), or refused at other values than verl's default (one line each)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from hybrid.config import ConfigError, build_config
from hybrid.config.loading import check_override_keys, default_config, load_config, rewrite_foreign_overrides
from hybrid.main_ppo import prepare_command_line

ARR = "actor_rollout_ref"
VERL = json.loads((Path(__file__).parents[1] / "data" / "peer_config_keys.json").read_text())["verl"]["ppo_trainer"]
# verl's defaults refused with the reason: sections of engines and services hybrid lacks.
REFUSED_AT_DEFAULT = {
    f"{ARR}.rollout.engine_kwargs.sglang": "vllm and hf",
    f"{ARR}.rollout.engine_kwargs.trtllm": "vllm and hf",
    "reward_model.sandbox_fusion.url": "no sandbox",
    "reward_model.sandbox_fusion.max_concurrent": "no sandbox",
    "reward_model.sandbox_fusion.memory_limit_mb": "no sandbox",
}


def override(key: str, value) -> str:
    """`key=value` as a verl script writes it (Hydra's syntax; strings quoted where they need it)."""
    if isinstance(value, bool) or value is None:
        text = json.dumps(value)
    elif isinstance(value, str):
        text = value if value.startswith("${") or re.fullmatch(r"[\w./-]+", value) else repr(value)
    else:
        text = json.dumps(value)
    return f"{key}={text}"


def test_the_json_holds_verls_556_keys():
    assert len(VERL) == 556 and VERL["trainer.n_gpus_per_node"] == 8


def test_every_verl_key_composes_at_its_verl_default():
    overrides = [override(k, v) for k, v in VERL.items() if k not in REFUSED_AT_DEFAULT]
    rewritten, _ = rewrite_foreign_overrides(overrides)
    check_override_keys(rewritten, default_config())  # raises naming every unknown key at once
    load_config(overrides)  # and Hydra composes them all


@pytest.mark.parametrize(("key", "reason"), REFUSED_AT_DEFAULT.items())
def test_the_rest_are_refused_at_start_with_the_reason(key, reason):
    with pytest.raises(ConfigError) as err:
        load_config([override(key, VERL[key])])
    assert reason in str(err.value) and "unknown config key" not in str(err.value)


@pytest.mark.parametrize(
    ("given", "message"),
    [
        (
            f"{ARR}.actor._target_=my_pkg.MyActorConfig",
            f"{ARR}.actor._target_=my_pkg.MyActorConfig: verl's Hydra class for this section; hybrid builds its own",
        ),
        (
            f"{ARR}.actor.fsdp_config.model_dtype=bfloat16",
            f"{ARR}.actor.fsdp_config.model_dtype=bfloat16: the weights hybrid loads and trains are fp32",
        ),
        (
            f"{ARR}.actor.optim.optimizer=AdamW8bit",
            f"{ARR}.actor.optim.optimizer=AdamW8bit: hybrid's optimizer is torch.optim.AdamW (fused)",
        ),
        (
            f"{ARR}.rollout.over_sample_rate=0.1",
            f"{ARR}.rollout.over_sample_rate=0.1: hybrid waits for every training response",
        ),
        (f"{ARR}.actor.router_replay.mode=R3", f"{ARR}.actor.router_replay.mode=R3: MoE router replay"),
        (f"{ARR}.model.mtp.enable=True", f"{ARR}.model.mtp.enable=True: multi-token prediction"),
        ("transfer_queue.enable=True", "transfer_queue.enable=True: verl's TransferQueue data plane"),
        ("ray_kwargs.ray_init.num_cpus=8", "ray_kwargs.ray_init.num_cpus=8: hybrid sizes Ray's CPU slots itself"),
        (f"{ARR}.actor.fsdp_config.dtype=float16", "no fp16 loss scaling"),
    ],
)
def test_a_value_hybrid_does_not_implement_is_refused_in_one_line(given, message):
    with pytest.raises(ConfigError) as err:
        load_config([given])
    (line,) = str(err.value).splitlines()
    assert line.startswith(message) if "=" in message.split(":")[0] else message in line


def test_verls_defaults_of_those_keys_change_nothing():
    plain = load_config([])
    given = load_config(
        [
            f"{ARR}.actor._target_=verl.workers.config.FSDPActorConfig",
            f"{ARR}.actor.fsdp_config.model_dtype=fp32",
            f"{ARR}.rollout.over_sample_rate=0",
            f"{ARR}.actor.router_replay.mode=disabled",
            "data.train_max_samples=-1",
            f"{ARR}.actor.use_remove_padding=${{oc.select:actor_rollout_ref.model.use_remove_padding,false}}",
        ]
    )
    assert given == plain


def test_keys_verl_reads_under_another_name_set_hybrids():
    arr = build_config(
        [
            f"{ARR}.actor.tau_pos=1.5",
            f"{ARR}.actor.tau_neg=2.0",
            f"{ARR}.actor.fsdp_config.dtype=float32",
            f"{ARR}.actor.use_remove_padding=false",
        ]
    ).actor_rollout_ref
    assert (arr.actor.policy_loss.sapo_tau_pos, arr.actor.policy_loss.sapo_tau_neg) == (1.5, 2.0)
    assert arr.actor.fsdp_config.mixed_precision == "fp32" and arr.model.use_remove_padding is False
    cfg = load_config(
        [f"{ARR}.nccl_timeout=120", f"{ARR}.rollout.enable_prefix_caching=True", "critic.model.fsdp_config.dtype=bf16"]
    )
    assert cfg.critic.model.fsdp_config.mixed_precision == "bf16"
    assert cfg.trainer.worker_env_vars.HYBRID_DIST_TIMEOUT_S == 120  # workers/base.py's process-group timeout
    assert cfg.actor_rollout_ref.rollout.engine_kwargs.vllm.enable_prefix_caching is True


def test_a_renamed_key_and_hybrids_own_at_different_values_are_refused():
    with pytest.raises(ConfigError) as err:
        load_config([f"{ARR}.actor.tau_pos=1.5", f"{ARR}.actor.policy_loss.sapo_tau_pos=1.0"])
    assert str(err.value) == (
        f"{ARR}.actor.policy_loss.sapo_tau_pos is given as {ARR}.actor.tau_pos=1.5 and as "
        f"{ARR}.actor.policy_loss.sapo_tau_pos=1.0: give one of them"
    )


def test_keys_with_no_effect_here_are_named_in_one_line(capsys):
    argv = prepare_command_line(
        [
            f"{ARR}.actor.fsdp_config.seed=7",
            "global_profiler.global_tool_config.nsys.discrete=True",
            f"{ARR}.rollout.prometheus.enable=True",
            f"{ARR}.actor.optim.clip_grad=1.0",  # verl's default; its default workers clip by actor.grad_clip
            "trainer.seed=3",
        ]
    )
    assert argv == ["trainer.seed=3"]
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"hybrid: accepted with no effect here: {ARR}.actor.fsdp_config.seed: read only by verl's")
    assert "global_profiler.global_tool_config.nsys.discrete: options of a profiler tool hybrid refuses" in line
    assert f"{ARR}.rollout.prometheus.enable: verl's Prometheus" in line


def test_a_key_hybrids_yaml_holds_is_left_to_the_yaml():
    from hybrid.config.verl_keys import DEFAULT_ONLY, NO_EFFECT, RENAMED, TARGETS, rewrite_overrides

    known = {"data.train_max_samples"}
    assert rewrite_overrides(["data.train_max_samples=5"], known) == (["data.train_max_samples=5"], None, [])
    # and no key of the tables is one hybrid's yaml holds today
    from hybrid.config.loading import config_paths

    paths = config_paths(default_config())[0]
    tables = [*TARGETS, *DEFAULT_ONLY, *RENAMED]
    assert not [k for k in tables if k in paths]
    assert not [k for k in paths if any(pattern.match(k) for pattern, _ in NO_EFFECT)]


def test_rollout_generations_are_written_as_verl_writes_them(tmp_path, tokenizer):
    import numpy as np
    import torch

    from hybrid.generation_dump import dump_rollouts, write_generations
    from protocol.data_proto import DataProto

    prompts = tokenizer(["2 + 3 =", "7 - 1 ="], return_tensors="pt", padding=True).input_ids
    responses = tokenizer([" 5", " 6"], return_tensors="pt", padding=True).input_ids
    scores = torch.zeros(2, responses.shape[1])
    scores[0, -1], scores[1, -1] = 1.0, 0.5
    batch = DataProto.from_dict(
        {"prompts": prompts, "responses": responses, "token_level_scores": scores},
        non_tensors={"reward_model": np.array([{"ground_truth": "5"}, {"ground_truth": np.int64(6)}], dtype=object)},
    )
    path = dump_rollouts(str(tmp_path / "rollouts"), 3, batch, tokenizer)
    assert path == str(tmp_path / "rollouts" / "3.jsonl")
    rows = [json.loads(line) for line in Path(path).read_text().splitlines()]
    assert rows == [
        {"input": "2 + 3 =", "output": " 5", "gts": "5", "score": 1.0, "step": 3},
        {"input": "7 - 1 =", "output": " 6", "gts": 6, "score": 0.5, "step": 3},
    ]
    assert dump_rollouts(None, 3, batch, tokenizer) is None
    # validation's file: the reward's extra values of the samples' length join each line
    path = write_generations(str(tmp_path), 0, ["a"], ["b"], [None], [0.0], {"reward": [0.0], "acc": [1], "x": []})
    assert json.loads(Path(path).read_text()) == {
        "input": "a",
        "output": "b",
        "gts": None,
        "score": 0.0,
        "step": 0,
        "reward": 0.0,
        "acc": 1,
    }


def test_max_samples_keep_verls_rows(tmp_path, tokenizer):
    import numpy as np

    from hybrid.data import create_rl_dataset

    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"row {i}", "data_source": "x"}) + "\n" for i in range(10)))
    data = build_config(["data.shuffle=false", "data.train_max_samples=3"]).data
    assert [r["prompt"] for r in create_rl_dataset(str(path), data, tokenizer, None, 3).rows] == [
        "row 0",
        "row 1",
        "row 2",
    ]
    data = build_config(["data.seed=5", "data.val_max_samples=4"]).data  # data.shuffle=true: verl's numpy draw
    expected = np.random.default_rng(5).choice(10, size=4, replace=False).tolist()
    ds = create_rl_dataset(str(path), data, tokenizer, None, data.val_max_samples)
    assert [r["prompt"] for r in ds.rows] == [f"row {i}" for i in expected] and len(set(expected)) == 4
    assert len(create_rl_dataset(str(path), data, tokenizer, None, 20)) == 10  # more than the rows: all


def test_num_cycles_shapes_the_cosine_schedule():
    import torch

    from workers.fsdp_utils import build_lr_scheduler

    optim = build_config(
        [f"{ARR}.actor.optim.warmup_style=cosine", f"{ARR}.actor.optim.num_cycles=1.0", f"{ARR}.actor.optim.lr=1.0"]
    ).actor_rollout_ref.actor.optim
    assert optim.num_cycles == 1.0
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=1.0)
    scheduler = build_lr_scheduler(optimizer, optim, total_steps=8)
    lrs = []
    for _ in range(8):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    # one whole period: lr = 0.5 * (1 + cos(2 pi t / 8)) -> 1, 0.854, 0.5, 0.146, 0, 0.146, 0.5, 0.854
    assert lrs == pytest.approx([1.0, 0.853553, 0.5, 0.146447, 0.0, 0.146447, 0.5, 0.853553], abs=1e-6)


def test_verls_deprecated_warmup_style_default_builds_with_its_scheduler():
    # verl's default warmup_style is null (deprecated): lr_scheduler_type decides, constant when unset
    arr = build_config([f"{ARR}.actor.optim.warmup_style=null", "critic.optim.warmup_style=null"]).actor_rollout_ref
    assert arr.actor.optim.schedule == "constant"
    optim = build_config(
        [f"{ARR}.actor.optim.warmup_style=null", f"{ARR}.actor.optim.lr_scheduler_type=cosine"]
    ).actor_rollout_ref.actor.optim
    assert optim.schedule == "cosine"
