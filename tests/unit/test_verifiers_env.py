"""agent.verifiers_env (workers/rollout/verifiers_env.py), without an engine: what it needs is
named at start; a row names its environment and task as SkyRL's prepare_dataset.py writes them;
a task the environment does not have, or whose answer differs from the row's, is refused; SkyRL's
run_verifiers.sh composes with its entry module read as the verifiers_env agent loop. The
rollout itself (tokens, masks, rubric rewards) is tested in tests/integration/test_agent_loops.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from hybrid.config import ConfigError, build_config
from workers.rollout.verifiers_env import KEY, environment_of, example_index

R = "actor_rollout_ref.rollout"
DATA = Path(__file__).resolve().parents[1] / "data" / "peer_examples" / "skyrl.json"


def test_verifiers_env_needs_the_agent_loops_the_endpoint_and_multi_turn():
    with pytest.raises(ConfigError) as info:
        build_config([f"{KEY}=will/wordle"])
    message = str(info.value)
    for needed in (f"{R}.mode=async", f"{R}.multi_turn.enable=true", f"{R}.agent.enable_http_endpoint=true"):
        assert f"{KEY}='will/wordle' runs its episodes as agent loops through the OpenAI endpoint: set {needed}" in (
            message
        )
    keys = [
        f"{KEY}=will/wordle",
        f"{R}.mode=async",
        f"{R}.multi_turn.enable=true",
        f"{R}.agent.enable_http_endpoint=true",
    ]
    assert build_config(keys).actor_rollout_ref.rollout.agent.verifiers_env == "will/wordle"


def test_a_row_names_its_environment_and_task_as_skyrl_writes_them():
    skyrl_row = {"example_id": 7, "verifiers": {"answer": "crane", "task": "default", "environment": "wordle"}}
    assert environment_of(skyrl_row, "will/wordle") == "wordle"  # the row's, as SkyRL's generator reads it
    assert example_index(skyrl_row, "batch row 0") == 7
    assert example_index({"example_id": 7, "verifiers": {"example_id": 3}}, "batch row 0") == 3
    assert environment_of({"verifiers": {"answer": "x"}}, "will/wordle") == "will/wordle"
    with pytest.raises(ValueError, match=rf"a row without verifiers.environment: set {KEY} to the verifiers"):
        environment_of({"prompt": "hi"}, None)
    with pytest.raises(ValueError, match=r"batch row 4: no verifiers.example_id or example_id column"):
        example_index({"verifiers": {"environment": "wordle"}}, "batch row 4")


@pytest.mark.integration  # imports the verifiers library (1-2 s)
def test_a_task_the_environment_lacks_or_whose_answer_differs_is_refused(tmp_path, monkeypatch):
    pytest.importorskip("verifiers.v1", reason="the verifiers extra: pip install -e '.[verifiers]'")
    from tests.integration.verifiers_helpers import TASKS, write_package
    from workers.rollout.verifiers_env import VerifiersEnvironment

    write_package(tmp_path, "hybrid_toy_tasks")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        env = VerifiersEnvironment("owner/hybrid-toy-tasks@1.0")
    finally:
        sys.modules.pop("hybrid_toy_tasks", None)
    assert sorted(env.tasks) == list(range(len(TASKS)))
    task = env.task(2, {"verifiers": {"answer": TASKS[2][1]}}, "batch row 0")
    assert task.data.prompt[0].content == TASKS[2][0] and task.data.answer == TASKS[2][1]
    with pytest.raises(ValueError, match=r"batch row 1: example_id 9 is not a task of 'owner/hybrid-toy-tasks@1.0'"):
        env.task(9, {}, "batch row 1")
    with pytest.raises(ValueError, match=r"batch row 2: verifiers.answer 'blue' is not task 1's answer 'red'"):
        env.task(1, {"verifiers": {"answer": "blue"}}, "batch row 2")


def test_skyrl_run_verifiers_composes_as_the_verifiers_env_agent_loop():
    from hybrid.dialects import translate_argv
    from scripts.peer_examples import UNDERSTOOD, skyrl

    examples = json.loads(DATA.read_text())["examples"]
    example = next(e for e in examples if e["path"] == "examples/train_integrations/verifiers/run_verifiers.sh")
    assert "environment.env_class=will/wordle" in example["argv"]
    assert skyrl.check(example, Path(".")) == (UNDERSTOOD, "")
    # What a user writes for the entry module: the environment under hybrid's key, the endpoint, multi-turn.
    argv = [a for a in example["argv"] if not a.startswith("environment.env_class=")]
    argv += [
        f"{KEY}=will/wordle",
        "generator.inference_engine.enable_http_endpoint=true",
        f"{R}.multi_turn.enable=true",
    ]
    rollout = build_config(translate_argv(["--dialect", "skyrl", *argv])).actor_rollout_ref.rollout
    assert (rollout.agent.verifiers_env, rollout.mode, rollout.agent.enable_http_endpoint) == (
        "will/wordle",
        "async",
        1,
    )
    assert rollout.multi_turn.enable is True and rollout.n == 5


def test_skyrl_verifiers_rows_need_no_ground_truth_when_an_environment_scores_them(tmp_path):
    """SkyRL's prepare_dataset.py rows (prompt, example_id, verifiers; no reward_model) load for a
    verifiers run; without one, or with a reward function that reads ground truth, they are refused."""
    from hybrid.preflight import Findings, check_data_files

    row = {"data_source": "verifiers/wordle", "prompt": [{"role": "user", "content": "Guess."}], "example_id": 0}
    row["verifiers"] = {"answer": "crane", "task": "default", "environment": "wordle"}
    path = tmp_path / "train.jsonl"
    path.write_text("\n".join(json.dumps({**row, "example_id": i}) for i in range(4)) + "\n")
    base = [f"data.train_files={path}", f"data.val_files={path}", "data.train_batch_size=4"]
    base += ["actor_rollout_ref.actor.ppo_mini_batch_size=4", f"{R}.mode=async", f"{R}.multi_turn.enable=true"]
    base += [f"{R}.agent.enable_http_endpoint=true"]
    missing = f"data file {path} has no column 'reward_model' (a dict with 'ground_truth' per row"
    for extra, refused in (
        ([f"{KEY}=wordle"], False),
        ([], True),
        ([f"{R}.agent.default_agent_loop=verifiers_env"], False),
    ):
        found = Findings()
        check_data_files(build_config(base + extra), found)
        assert any(missing in p for p in found.problems) is refused, (extra, found.problems)
    reward_file = tmp_path / "score.py"
    reward_file.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 0.0\n"
    )
    found = Findings()
    check_data_files(build_config([*base, f"{KEY}=wordle", f"custom_reward_function.path={reward_file}"]), found)
    assert any(missing in p for p in found.problems)


def test_the_environment_package_is_found_before_anything_starts(tmp_path, monkeypatch):
    """agent.verifiers_env names an installed package as verifiers imports it (owner/ and @version
    dropped, - as _); one that is not installed is named at preflight, in one line."""
    from types import SimpleNamespace

    from hybrid.preflight import Findings, check_verifiers_installed

    (tmp_path / "my_wordle_env").mkdir()
    (tmp_path / "my_wordle_env" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    found = Findings()
    check_verifiers_installed(SimpleNamespace(verifiers_env="will/my-wordle-env@0.1.4", default_agent_loop=None), found)
    check_verifiers_installed(SimpleNamespace(verifiers_env=None, default_agent_loop="verifiers_env"), found)
    check_verifiers_installed(SimpleNamespace(verifiers_env=None, default_agent_loop=None), found)
    assert found.problems == []
    check_verifiers_installed(SimpleNamespace(verifiers_env="will/wordle-x@0.1", default_agent_loop=None), found)
    assert found.problems == [
        f"{KEY}='will/wordle-x@0.1': no environment package 'wordle_x' is installed (verifiers imports the "
        "environment by that name): install it (SkyRL's install_environment.py does), or put it on PYTHONPATH"
    ]
