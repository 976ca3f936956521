"""Experiment loggers: where the trainer's per-step metric dicts go.

`Tracking` fans one `log(metrics, step)` call out to the backends named in
`trainer.logger` (verl's names): `console` (one compact line per step), `file`
(`<local_dir>/metrics.jsonl`, one JSON object per step, read by scripts/plot_metrics.py),
`tensorboard`, `wandb` and `mlflow`. The last two are optional packages imported only
when selected. `ValidationGenerationsLogger` shows a few validation samples per step.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import re
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

__all__ = ["Tracking", "ValidationGenerationsLogger", "SUPPORTED_BACKENDS", "to_float"]

SUPPORTED_BACKENDS = ("console", "file", "tensorboard", "wandb", "mlflow")


def to_float(value: Any) -> float | None:
    """The value as a float if it is a real number (Python, numpy or a one-element
    tensor/array), else None. Strings, lists and the like are not metrics."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, numbers.Real):
        return float(value)
    # numpy arrays and torch tensors with a single element; checked by duck typing so this
    # module does not import torch.
    if hasattr(value, "numel") and hasattr(value, "item") and callable(value.numel):
        return float(value.item()) if value.numel() == 1 and not value.is_complex() else None
    if hasattr(value, "size") and hasattr(value, "item") and hasattr(value, "dtype"):
        if value.size == 1 and getattr(value.dtype, "kind", "") in "biuf":
            return float(value.item())
    return None


def _numeric(data: dict[str, Any]) -> dict[str, float]:
    out = {}
    for key, value in data.items():
        number = to_float(value)
        if number is not None:
            out[str(key)] = number
    return out


# The package each optional backend imports; pyproject.toml's `loggers` extra installs them all.
LOGGER_PACKAGES = {"wandb": "wandb", "mlflow": "mlflow", "tensorboard": "tensorboard"}


def _missing_message(backend: str, package: str) -> str:
    return (
        f"trainer.logger includes {backend!r} but the package {package!r} is not installed: pip install {package} "
        f"(or the loggers extra, pip install -e '.[loggers]'), or remove {backend!r} from trainer.logger"
    )


def missing_logger_packages(backends: Sequence[str]) -> list[str]:
    """One message per backend in `backends` whose package is not installed (checked before
    anything starts: hybrid/preflight.py); nothing is imported."""
    import importlib.util

    return [
        _missing_message(backend, LOGGER_PACKAGES[backend])
        for backend in dict.fromkeys(backends)
        if backend in LOGGER_PACKAGES and importlib.util.find_spec(LOGGER_PACKAGES[backend]) is None
    ]


def _missing_package(backend: str, package: str, error: ImportError) -> ImportError:
    return ImportError(_missing_message(backend, package)).with_traceback(error.__traceback__)


# ---------------------------------------------------------------------------- console

# (label, candidate keys in order of preference, formatter). The first key present wins.
_CONSOLE_FIELDS: list[tuple[str, tuple[str, ...]]] = [
    ("score", ("critic/score/mean",)),
    # On-policy distillation's KL to the teacher first: it is what such a run minimises.
    ("kl", ("distillation/reverse_kl", "actor/kl_loss", "actor/reward_kl_penalty", "actor/ppo_kl")),
    ("ent", ("actor/entropy",)),
    ("len", ("response_length/mean",)),
    # Agent loops (rollout.mode=async): trajectories in flight at most, the slow tail's latency.
    ("agents", ("agent/in_flight/max",)),
    ("p95", ("agent/latency_s/p95",)),
    # The SFT trainer (hybrid/sft_trainer.py).
    ("loss", ("train/loss",)),
    ("val_loss", ("val/loss",)),
]


def _short(x: float) -> str:
    if math.isnan(x) or math.isinf(x):
        return str(x)
    if x != 0 and (abs(x) >= 1000 or abs(x) < 1e-4):
        return f"{x:.3g}"
    if abs(x) >= 100:
        return f"{x:.0f}"
    return f"{x:.3g}"


def console_line(data: dict[str, float], step: int) -> str:
    """`step 3 | score 0.41 | val 0.55 | kl 0.001 | ent 1.2 | len 23 | 8.1 s`: a handful of
    headline numbers, each shown only when its key was logged this step."""
    parts = [f"step {step}"]
    for label, keys in _CONSOLE_FIELDS[:1]:
        key = next((k for k in keys if k in data), None)
        if key is not None:
            parts.append(f"{label} {_short(data[key])}")
    # Validation: mean over data sources of the headline val-core mean@N.
    val = [v for k, v in data.items() if k.startswith("val-core/") and "/mean@" in k]
    if val:
        parts.append(f"val {_short(sum(val) / len(val))}")
    for label, keys in _CONSOLE_FIELDS[1:]:
        key = next((k for k in keys if k in data), None)
        if key is not None:
            parts.append(f"{label} {_short(data[key])}")
    if "timing_s/step" in data:
        parts.append(f"{data['timing_s/step']:.1f} s")
    return " | ".join(parts)


class _ConsoleBackend:
    def log(self, data: dict[str, float], step: int) -> None:
        # tqdm.write keeps the line from tearing the trainer's progress bar.
        tqdm.write(console_line(data, step))

    def finish(self) -> None:
        pass


# ---------------------------------------------------------------------------- file


class _FileBackend:
    def __init__(self, local_dir: str | os.PathLike):
        self.path = Path(local_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Append: a resumed run continues the same file (continue_from first drops what an earlier run
        # logged past the resumed step); a step can span two lines (training, then validation).
        self._fh = open(self.path, "a", encoding="utf-8")

    def log(self, data: dict[str, float], step: int) -> None:
        # NaN/inf become null so the file stays strict JSON for jq and other readers.
        record = {"step": int(step)}
        record.update({k: (v if math.isfinite(v) else None) for k, v in data.items() if k != "step"})
        self._fh.write(json.dumps(record, allow_nan=False) + "\n")
        self._fh.flush()

    def keep_through(self, step: int) -> int:
        """Drop the lines a run before this one wrote after `step` (all of them for a run that
        starts at step 0), so that a run resumed from an older checkpoint records each step once.
        The file is rewritten under a temporary name and renamed; returns the lines dropped."""
        self._fh.close()
        lines = self.path.read_text(encoding="utf-8").splitlines(keepends=True)
        kept = [line for line in lines if step > 0 and json.loads(line)["step"] <= step]
        if len(kept) < len(lines):
            tmp = self.path.with_name(self.path.name + ".tmp")
            tmp.write_text("".join(kept), encoding="utf-8")
            os.replace(tmp, self.path)
        self._fh = open(self.path, "a", encoding="utf-8")
        return len(lines) - len(kept)

    def finish(self) -> None:
        if not self._fh.closed:
            self._fh.close()


# ---------------------------------------------------------------------------- tensorboard


class _TensorboardBackend:
    def __init__(self, local_dir: str | os.PathLike):
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = os.environ.get("TENSORBOARD_DIR") or str(Path(local_dir) / "tensorboard")
        os.makedirs(self.log_dir, exist_ok=True)
        self.writer = SummaryWriter(log_dir=self.log_dir)

    def log(self, data: dict[str, float], step: int) -> None:
        for key, value in data.items():
            self.writer.add_scalar(key, value, global_step=step)
        self.writer.flush()

    def finish(self) -> None:
        self.writer.close()


# ---------------------------------------------------------------------------- wandb


def _config_container(config: Any) -> Any:
    if config is None:
        return None
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if isinstance(config, (DictConfig, ListConfig)):
        # resolve=False: an interpolation that cannot resolve outside the run must not
        # stop logging; verl logs the unresolved config too.
        return OmegaConf.to_container(config, resolve=False)
    return config


class _WandbBackend:
    def __init__(
        self,
        project_name: str,
        experiment_name: str,
        config: Any,
        local_dir: str | os.PathLike,
        tags: Sequence[str] | None = None,
    ):
        try:
            import wandb
        except ImportError as e:
            raise _missing_package("wandb", "wandb", e) from e
        self.wandb = wandb
        kwargs: dict[str, Any] = {"project": project_name, "name": experiment_name, "config": _config_container(config)}
        if tags:
            kwargs["tags"] = [str(tag) for tag in tags]
        # WANDB_MODE (e.g. offline) and WANDB_DIR are read by wandb itself; only choose a
        # directory when the user did not.
        if not os.environ.get("WANDB_DIR"):
            os.makedirs(local_dir, exist_ok=True)
            kwargs["dir"] = str(local_dir)
        self.run = wandb.init(**kwargs)

    def log(self, data: dict[str, float], step: int) -> None:
        self.run.log(data, step=step)

    def finish(self) -> None:
        self.run.finish()


# ---------------------------------------------------------------------------- mlflow

_MLFLOW_BAD_CHARS = re.compile(r"[^A-Za-z0-9_\-. /]")


def mlflow_metric_name(key: str) -> str:
    """mlflow accepts letters, digits, `_ - . /` and spaces in names: `@` becomes `_at_`
    (so `mean@4` stays readable), anything else `_`."""
    return _MLFLOW_BAD_CHARS.sub("_", key.replace("@", "_at_"))


def _flatten(config: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(config, dict):
        out: dict[str, Any] = {}
        for key, value in config.items():
            out.update(_flatten(value, f"{prefix}{key}."))
        return out
    if isinstance(config, list):
        out = {}
        for i, value in enumerate(config):
            out.update(_flatten(value, f"{prefix}{i}."))
        return out
    return {prefix[:-1]: config}


class _MlflowBackend:
    # mlflow rejects parameter values longer than this in older versions (500 chars).
    MAX_PARAM_CHARS = 500

    def __init__(self, project_name: str, experiment_name: str, config: Any, local_dir: str | os.PathLike):
        try:
            import mlflow
        except ImportError as e:
            raise _missing_package("mlflow", "mlflow", e) from e
        self.mlflow = mlflow
        if not os.environ.get("MLFLOW_TRACKING_URI"):
            store = Path(local_dir).resolve() / "mlruns"
            store.mkdir(parents=True, exist_ok=True)
            mlflow.set_tracking_uri(store.as_uri())
        mlflow.set_experiment(project_name)
        self.run = mlflow.start_run(run_name=experiment_name)
        container = _config_container(config)
        if container:
            params = {
                mlflow_metric_name(k): str(v)[: self.MAX_PARAM_CHARS] for k, v in _flatten(container).items() if k
            }
            mlflow.log_params(params)

    def log(self, data: dict[str, float], step: int) -> None:
        self.mlflow.log_metrics({mlflow_metric_name(k): v for k, v in data.items()}, step=step)

    def finish(self) -> None:
        self.mlflow.end_run()


# ---------------------------------------------------------------------------- fan-out


class Tracking:
    """Sends each step's metrics to every selected backend.

    Only real numbers are logged (strings and other objects in the dict are dropped with
    a one-time warning per key), and `file` writes `{"step": N, ...}` lines to
    `<local_dir>/metrics.jsonl`.
    """

    def __init__(
        self,
        project_name: str,
        experiment_name: str,
        default_backend: Sequence[str] | str = "console",
        config: Any = None,
        local_dir: str | os.PathLike = ".",
        wandb_tags: Sequence[str] | None = None,
    ):
        backends = [default_backend] if isinstance(default_backend, str) else list(default_backend)
        unknown = [b for b in backends if b not in SUPPORTED_BACKENDS]
        if unknown:
            raise ValueError(
                f"unknown logger backend(s) {', '.join(map(repr, unknown))} in trainer.logger; "
                f"supported: {', '.join(SUPPORTED_BACKENDS)}"
            )
        self.backends = list(dict.fromkeys(backends))
        self.local_dir = Path(local_dir)
        self._warned_keys: set[str] = set()
        self._wandb_tags = wandb_tags  # trainer.wandb_tags (SkyRL's trainer.tags)
        self.loggers: dict[str, Any] = {}
        try:
            for name in self.backends:
                self.loggers[name] = self._make(name, project_name, experiment_name, config)
        except BaseException:
            # Close what was opened before the failing backend (open files, writers, runs).
            self.finish()
            raise

    def continue_from(self, step: int) -> None:
        """The run goes on from `step` (0: a fresh start): metrics.jsonl forgets what an earlier
        run in the same folder logged past it (the other backends keep their own history)."""
        backend = self.loggers.get("file")
        if backend is None:
            return
        dropped = backend.keep_through(step)
        if dropped:
            where = f"after step {step}" if step else "by an earlier run in this folder"
            print(f"hybrid: {backend.path}: dropped {dropped} line(s) logged {where}", flush=True)

    def _make(self, name: str, project_name: str, experiment_name: str, config: Any):
        if name == "console":
            return _ConsoleBackend()
        if name == "file":
            return _FileBackend(self.local_dir)
        if name == "tensorboard":
            return _TensorboardBackend(self.local_dir)
        if name == "wandb":
            return _WandbBackend(project_name, experiment_name, config, self.local_dir, self._wandb_tags)
        if name == "mlflow":
            return _MlflowBackend(project_name, experiment_name, config, self.local_dir)
        raise AssertionError(name)  # guarded by the check in __init__

    def log(self, data: dict[str, Any], step: int, backends: Sequence[str] | None = None) -> None:
        """Log `data` at `step` to every backend, or to those of `backends` this tracker has
        (the trainer prints a step's console line before its checkpoint messages and logs
        the rest after)."""
        numeric = _numeric(data)
        skipped = [k for k in data if str(k) not in numeric and str(k) not in self._warned_keys]
        if skipped:
            self._warned_keys.update(map(str, skipped))
            warnings.warn(f"Tracking.log: not numbers, not logged: {skipped}", stacklevel=2)
        for name, logger in self.loggers.items():
            if backends is None or name in backends:
                logger.log(numeric, step)

    def finish(self) -> None:
        for logger in self.loggers.values():
            logger.finish()
        self.loggers = {}

    def __del__(self):
        # A crashed run still leaves complete lines behind; close files if finish() was
        # never reached. Only the file backend is closed here: remote runs need an
        # explicit finish().
        file_backend = getattr(self, "loggers", {}).get("file")
        if file_backend is not None:
            file_backend.finish()


# ---------------------------------------------------------------------------- validation samples


def _clip(text: Any, width: int) -> str:
    text = str(text).replace("\r", "").replace("\n", "⏎")
    return text if len(text) <= width else text[: width - 1] + "…"


def _json_score(score: Any) -> float | str | None:
    # NaN/inf become null as in metrics.jsonl, so the file stays strict JSON.
    number = to_float(score)
    if number is None:
        return str(score)
    return number if math.isfinite(number) else None


class ValidationGenerationsLogger:
    """A few validation (input, output, score) samples per validation step: a small table
    on the console when `console` is on, and one JSON line per step in
    `<local_dir>/val_generations.jsonl` (full texts) when `file` is on."""

    INPUT_WIDTH = 48
    OUTPUT_WIDTH = 48

    def __init__(self, local_dir: str | os.PathLike = "."):
        self.local_dir = Path(local_dir)

    def log(self, loggers: Sequence[str] | str, samples: Sequence[tuple[Any, Any, Any]], step: int) -> None:
        loggers = [loggers] if isinstance(loggers, str) else list(loggers)
        if "console" in loggers:
            tqdm.write(self.table(samples, step))
        if "file" in loggers:
            self.local_dir.mkdir(parents=True, exist_ok=True)
            record = {
                "step": int(step),
                "samples": [{"input": str(i), "output": str(o), "score": _json_score(s)} for i, o, s in samples],
            }
            with open(self.local_dir / "val_generations.jsonl", "a", encoding="utf-8") as fh:
                fh.write(json.dumps(record, ensure_ascii=False, allow_nan=False) + "\n")

    def table(self, samples: Sequence[tuple[Any, Any, Any]], step: int) -> str:
        wi, wo = self.INPUT_WIDTH, self.OUTPUT_WIDTH
        lines = [f"validation samples at step {step}:", f"  {'input':<{wi}} | {'output':<{wo}} | score"]
        lines.append("  " + "-" * wi + "-+-" + "-" * wo + "-+------")
        for inp, out, score in samples:
            number = to_float(score)
            shown = _short(number) if number is not None else _clip(score, 8)
            lines.append(f"  {_clip(inp, wi):<{wi}} | {_clip(out, wo):<{wo}} | {shown}")
        return "\n".join(lines)
