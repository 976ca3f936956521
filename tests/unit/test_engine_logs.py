"""The engine's log lines (workers/engine_logs.py): everything from INFO up in the run's
engine_rank<R>.log, on the console only the warnings that ask something of the user."""

from __future__ import annotations

import io
import logging

import pytest

from workers import engine_logs


@pytest.fixture
def vllm_logger():
    """A stand-in for vLLM's own logger set-up: logger "vllm", a console handler, no propagation."""
    logger = logging.getLogger("vllm")
    saved = (logger.handlers[:], logger.level, logger.propagate)
    console = io.StringIO()
    logger.handlers = [logging.StreamHandler(console)]
    logger.propagate = False
    yield logger, console
    for handler in logger.handlers:
        if isinstance(handler, logging.FileHandler):
            handler.close()
    logger.handlers, logger.level, logger.propagate = saved


def test_console_keeps_real_warnings_and_the_file_gets_everything(vllm_logger, tmp_path, monkeypatch):
    logger, console = vllm_logger
    monkeypatch.delenv("HYBRID_DEBUG", raising=False)
    monkeypatch.setenv(engine_logs.ENGINE_LOG_DIR_ENV, str(tmp_path / "run"))
    monkeypatch.setenv("RANK", "1")
    path = engine_logs.route_engine_logs()
    assert path == str(tmp_path / "run" / "engine_rank1.log")
    engine_logs.route_engine_logs()  # a second engine in the process adds no second file handler
    child = logging.getLogger("vllm.model_executor.layerwise")
    child.info("Reloading weights inplace...")
    child.warning("RotaryEmbedding: Failed to load weights")
    child.warning("libtcmalloc is not found in LD_PRELOAD. For best performance, please follow the docs")
    child.warning("KV cache is smaller than one request")
    child.error("RotaryEmbedding: Failed to load weights (as an error it is shown)")
    assert console.getvalue().splitlines() == [
        "KV cache is smaller than one request",
        "RotaryEmbedding: Failed to load weights (as an error it is shown)",
    ]
    written = open(path).read()
    for line in ("Reloading weights inplace", "RotaryEmbedding: Failed to load weights", "LD_PRELOAD", "smaller than one"):
        assert line in written
    assert len(written.splitlines()) == 5


def test_debug_leaves_vllm_as_it_is(vllm_logger, tmp_path, monkeypatch):
    logger, console = vllm_logger
    monkeypatch.setenv("HYBRID_DEBUG", "1")
    monkeypatch.setenv(engine_logs.ENGINE_LOG_DIR_ENV, str(tmp_path))
    monkeypatch.delenv("VLLM_LOGGING_LEVEL", raising=False)
    engine_logs.quiet_engine_before_import()
    assert engine_logs.route_engine_logs() is None
    logger.warning("RotaryEmbedding: Failed to load weights")
    assert "RotaryEmbedding" in console.getvalue() and not list(tmp_path.iterdir())
    import os

    assert "VLLM_LOGGING_LEVEL" not in os.environ
