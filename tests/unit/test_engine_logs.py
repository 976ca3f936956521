"""The engine's log lines (workers/engine_logs.py): everything from INFO up in the run's
engine_rank<R>.log, on the console only the warnings that ask something of the user; the
config reaches vLLM as the dictConfig file it reads (VLLM_LOGGING_CONFIG_PATH)."""

from __future__ import annotations

import json
import logging
import logging.config
import os

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
    for line in ("Reloading weights inplace", "RotaryEmbedding: Failed to load weights", "LD_PRELOAD", "smaller than one"):
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
