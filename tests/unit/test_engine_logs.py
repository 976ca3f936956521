"""The engine's log lines (workers/engine_logs.py): everything from INFO up in the run's
engine_rank<R>.log, on the console only the warnings that ask something of the user; the
config reaches vLLM as the dictConfig file it reads (VLLM_LOGGING_CONFIG_PATH)."""

from __future__ import annotations

import json
import logging
import logging.config
import os
import subprocess
import sys
import textwrap

import pytest

from workers import engine_logs


@pytest.fixture
def clean_env(monkeypatch):
    for name in ("HYBRID_DEBUG", engine_logs.CONFIG_PATH_ENV):
        monkeypatch.delenv(name, raising=False)
    logger = logging.getLogger("vllm")
    saved = (logger.handlers[:], logger.level, logger.propagate)
    yield monkeypatch
    for handler in logger.handlers:
        handler.close()
    logger.handlers, logger.level, logger.propagate = saved


def test_console_keeps_real_warnings_and_the_file_gets_everything(clean_env, tmp_path, capsys):
    clean_env.setenv(engine_logs.ENGINE_LOG_DIR_ENV, str(tmp_path / "run"))
    clean_env.setenv("RANK", "1")
    path = engine_logs.quiet_engine_before_import()
    assert path == str(tmp_path / "run" / "engine_rank1.log")
    # What vLLM does with the variable, at import and at every engine start.
    with open(os.environ[engine_logs.CONFIG_PATH_ENV]) as f:
        logging.config.dictConfig(json.load(f))
    child = logging.getLogger("vllm.model_executor.layerwise")
    child.info("Reloading weights inplace...")
    child.warning("RotaryEmbedding: Failed to load weights")
    child.warning("libtcmalloc is not found in LD_PRELOAD. For best performance, please follow the docs")
    child.warning("KV cache is smaller than one request")
    child.error("RotaryEmbedding: Failed to load weights (as an error it is shown)")
    assert capsys.readouterr().out.splitlines() == [
        "vllm WARNING: KV cache is smaller than one request",
        "vllm ERROR: RotaryEmbedding: Failed to load weights (as an error it is shown)",
    ]
    written = open(path).read()
    for line in (
        "Reloading weights inplace",
        "RotaryEmbedding: Failed to load weights",
        "LD_PRELOAD",
        "smaller than one",
    ):
        assert line in written
    assert len(written.splitlines()) == 5
    # A second engine in the process (another run folder) gets its own file; the old config goes.
    first_config = os.environ[engine_logs.CONFIG_PATH_ENV]
    clean_env.setenv(engine_logs.ENGINE_LOG_DIR_ENV, str(tmp_path / "run2"))
    assert engine_logs.quiet_engine_before_import() == str(tmp_path / "run2" / "engine_rank1.log")
    assert not os.path.exists(first_config)
    os.remove(os.environ[engine_logs.CONFIG_PATH_ENV])


def test_debug_or_the_users_own_config_leave_vllm_alone(clean_env, tmp_path):
    clean_env.setenv(engine_logs.ENGINE_LOG_DIR_ENV, str(tmp_path))
    clean_env.setenv("HYBRID_DEBUG", "1")
    assert engine_logs.quiet_engine_before_import() is None
    assert engine_logs.CONFIG_PATH_ENV not in os.environ and not list(tmp_path.iterdir())
    clean_env.delenv("HYBRID_DEBUG")
    clean_env.setenv(engine_logs.CONFIG_PATH_ENV, "/etc/my-vllm-logging.json")
    assert engine_logs.quiet_engine_before_import() is None
    assert os.environ[engine_logs.CONFIG_PATH_ENV] == "/etc/my-vllm-logging.json"


def test_model_loading_hides_transformers_progress_bar_unless_debugging(monkeypatch):
    from transformers.utils import logging as hf_logging

    from workers.model_loading import _no_progress_bar

    monkeypatch.delenv("HYBRID_DEBUG", raising=False)
    assert hf_logging.is_progress_bar_enabled()
    with _no_progress_bar():
        assert not hf_logging.is_progress_bar_enabled()
    assert hf_logging.is_progress_bar_enabled()
    monkeypatch.setenv("HYBRID_DEBUG", "1")
    with _no_progress_bar():
        assert hf_logging.is_progress_bar_enabled()


def test_stderr_of_the_engine_start_goes_to_the_engine_log_and_comes_back(tmp_path, capfd):
    log = tmp_path / "engine_rank0.log"
    log.write_text("earlier line\n")
    with engine_logs.stderr_to_engine_log(str(log)):
        os.write(2, b"[W utils.cpp:68] Warning: NUMA binding: from C level\n")  # what c10 does
    os.write(2, b"after the block\n")
    captured = capfd.readouterr()
    assert captured.err == "after the block\n"
    assert log.read_text().splitlines() == ["earlier line", "[W utils.cpp:68] Warning: NUMA binding: from C level"]
    # No log file (HYBRID_DEBUG=1, the user's logging config): stderr is left alone.
    with engine_logs.stderr_to_engine_log(None):
        os.write(2, b"shown\n")
    assert capfd.readouterr().err == "shown\n"


def test_an_engine_that_fails_to_start_still_raises_and_says_where_its_stderr_went(tmp_path, capfd):
    log = tmp_path / "engine_rank0.log"
    with pytest.raises(RuntimeError, match="engine refused"):
        with engine_logs.stderr_to_engine_log(str(log)):
            os.write(2, b"C++ detail of the failure\n")
            raise RuntimeError("engine refused")
    os.write(2, b"restored\n")
    err = capfd.readouterr().err
    assert err.splitlines() == [f"hybrid: the rollout engine's stderr output during its start is in {log}", "restored"]
    assert log.read_text() == "C++ detail of the failure\n"


def test_torchs_numa_notice_from_vllms_cpu_op_lands_in_the_log(tmp_path):
    """The real notice: vLLM's `init_cpu_memory_env` op (CPU builds) warns through c10's
    logging, past Python; run in a child so the memory binding stays there (and so that
    sys.stderr is the process's descriptor 2, as in a run, not pytest's capture)."""
    pytest.importorskip("vllm")
    log = tmp_path / "engine_rank0.log"
    code = textwrap.dedent(
        f"""
        import sys, torch, vllm._C
        from workers.engine_logs import stderr_to_engine_log
        if not hasattr(torch.ops._C, "init_cpu_memory_env"):
            raise SystemExit(3)
        with stderr_to_engine_log({str(log)!r}):
            torch.ops._C.init_cpu_memory_env([0])
            print("python stderr inside", file=sys.stderr)
        print("python stderr after", file=sys.stderr)
        """
    )
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
    if done.returncode == 3:
        pytest.skip("this vLLM build has no CPU memory binding op")
    assert done.returncode == 0, done.stderr
    console = done.stdout + done.stderr
    assert "NUMA binding" not in console and "inside" not in console and "python stderr after" in done.stderr
    written = log.read_text()
    assert "NUMA binding" in written and "python stderr inside" in written and "after" not in written


def test_vllms_import_time_notices_are_filtered_in_a_process_without_log_handlers(tmp_path):
    """A Ray worker's root logger has no handlers, so vLLM's records from before its config
    applies go to logging's last-resort handler: the harmless ones must be dropped there
    too, a real warning must still reach the console."""
    code = textwrap.dedent(
        """
        import logging
        from workers.engine_logs import quiet_engine_before_import
        assert not logging.getLogger().handlers
        quiet_engine_before_import()
        log = logging.getLogger("vllm.triton_utils.importing")
        log.warning("Triton is installed, but doesn't include CPU backend. Disabling Triton.")
        log.warning("a warning that matters")
        """
    )
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "HYBRID_ENGINE_LOG_DIR": str(tmp_path)}
    for name in ("HYBRID_DEBUG", engine_logs.CONFIG_PATH_ENV):
        env.pop(name, None)
    done = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Triton" not in done.stderr and "a warning that matters" in done.stderr
