"""ROLL's own example pipeline files (tests/data/peer_examples/roll.json, extracted from the ROLL
repository by scripts/peer_examples/roll.py) checked as `python -m hybrid.main_ppo --roll-config`
checks them before starting: none may end in a traceback, and the understood ones may not fall
back (a regression in the dialect fails here). The extractor's reading of Hydra `defaults` is
checked on a repository written for it."""

from __future__ import annotations

import subprocess

from scripts.count_peer_examples import count
from scripts.peer_examples import ERROR, UNDERSTOOD
from scripts.peer_examples.roll import check, extract

# The examples understood at the commit that last changed the dialect (docs/config_dialects.md
# has the table). Add to it when more are understood; the aim is 0.9 of those selected.
UNDERSTOOD_EXAMPLES = {
    "examples/ascend_examples/qwen3_30b_rlvr_fsdp2.yaml",
    "examples/ascend_examples/qwen3_8b_rlvr_fsdp2.yaml",
    "examples/qwen2.5-7B-rlvr_megatron/rlvr_fsdp2_sp2.yaml",
    "examples/qwen2.5-7B-rlvr_megatron/rlvr_lora_fsdp2.yaml",
    "examples/qwen2_5-vl-3B-rlvr_fsdp2/rlvr_fsdp2_offload.yaml",
    "examples/qwen3-30BA3B-agentic_fsdp2/agentic_val_sokoban_30a3.yaml",
    "examples/qwen3-30BA3B-rlvr_fsdp2/rlvr_config.yaml",
    "examples/qwen3-30BA3B-rlvr_fsdp2/rlvr_config_ep.yaml",
    "examples/qwen3-8B-rlvr_fsdp2/rlvr_config.yaml",
    "examples/qwen3-8B-rlvr_fsdp2/rlvr_config_wo_cpuoffload.yaml",
}


def test_no_roll_example_ends_in_a_traceback_and_the_understood_ones_hold():
    row = count("roll")
    assert [r for r in row["results"] if r["status"] == ERROR] == []
    assert row["selected"] == 11
    understood = {r["path"] for r in row["results"] if r["status"] == UNDERSTOOD}
    assert UNDERSTOOD_EXAMPLES <= understood, [r for r in row["results"] if r["path"] in UNDERSTOOD_EXAMPLES]


def _git_repo(root, files: dict[str, str]):
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    run = ["git", "-c", "user.email=t@t", "-c", "user.name=t", "-C", str(root)]
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    subprocess.run([*run, "add", "."], check=True)
    subprocess.run([*run, "commit", "-q", "-m", "x"], check=True)


def test_extract_keeps_the_defaults_files_and_selects_fsdp2_with_vllm(tmp_path):
    pipeline = (
        "defaults:\n  - ../config/envs@_here_\n"
        "rollout_batch_size: 8\nnum_return_sequences_in_group: 4\nadv_estimator: grpo\n"
        "actor_train:\n  strategy_args:\n    strategy_name: {train}\n"
        "actor_infer:\n  strategy_args:\n    strategy_name: vllm\n"
        "custom_envs:\n  Mine: ${{my_env}}\n"
    )
    _git_repo(
        tmp_path / "repo",
        {
            "examples/a/fsdp.yaml": pipeline.format(train="fsdp2_train"),
            "examples/a/megatron.yaml": pipeline.format(train="megatron_train"),
            "examples/config/envs.yaml": "my_env:\n  env_type: my_env_type\n  max_steps: 3\n",
        },
    )
    kept = {e["path"]: e for e in extract(tmp_path / "repo")["examples"]}
    assert [(p, e["selected"], e["why_not"]) for p, e in sorted(kept.items())] == [
        ("examples/a/fsdp.yaml", True, None),
        ("examples/a/megatron.yaml", False, "actor_train on megatron_train (not fsdp2_train)"),
        (
            "examples/config/envs.yaml",
            False,
            "fragment pulled in through Hydra defaults (an environment list), not a pipeline file",
        ),
    ]
    assert kept["examples/a/fsdp.yaml"]["defaults_files"] == {
        "examples/config/envs.yaml": "my_env:\n  env_type: my_env_type\n  max_steps: 3\n"
    }
    assert "text" not in kept["examples/a/megatron.yaml"]  # only what the check needs is kept
    # composed without the repository: the fragment's section arrives through ${my_env}
    status, reason = check(kept["examples/a/fsdp.yaml"], tmp_path / "work")
    assert status == "refused"
    assert "custom_envs.Mine.env_type=my_env_type" in reason, reason
