"""PNG plots of a run's metrics.jsonl (written by `trainer.logger=[...,file]`).

The command line is scripts/plot_metrics.py; the trainer calls `plot_metrics` at the
end of a run (`trainer.plot_on_finish`).

Writes, for the series the run logged (a missing series is left out, a plot with none is
not written):

- `reward.png`: training reward (`critic/score/mean`, with its min-max band) and the
  validation accuracy of each data source (`val-core/<source>/reward/mean@N`), dashed per
  question type where the rows name one (`val-aux/<source>/<subset>/reward/mean@N`);
- `kl_entropy.png`: KL (`actor/kl_loss`, `actor/ppo_kl`, `actor/reward_kl_penalty`) and
  `actor/entropy`;
- `response_length.png`: `response_length/mean` and `/max`;
- `timing.png`: the seconds of each phase (`timing_s/*`) as a stacked bar per step, with
  the step's wall time (`timing_s/step`) as a line;
- `staleness.png` (asynchronous training): the samples each step trained, stacked by how many
  weight versions old they were (`async/staleness/count_<k>`), and the run's histogram of
  the same, titled with the groups dropped as too stale (`async/dropped_stale`).

The file has one JSON object per step; a resumed run appends, so a step can appear more
than once: its lines are merged in file order, later values winning key by key (so the
validation line that a resumed run logs before training does not erase that step's
training metrics). The trainer calls `plot_metrics(metrics_path, out_dir)` at the end of a
run.
"""

from __future__ import annotations

import json
import math
import re
import warnings
from pathlib import Path

METRICS_FILE = "metrics.jsonl"
DEFAULT_SUBDIR = "plots"

SCORE = "critic/score/mean"
KL_KEYS = ("actor/kl_loss", "actor/ppo_kl", "actor/reward_kl_penalty")
ENTROPY = "actor/entropy"
LENGTH_KEYS = ("response_length/mean", "response_length/max")
VAL_CORE = re.compile(r"^val-core/(?P<source>.+)/(?P<var>reward|acc)/mean@(?P<n>\d+)$")
TIMING_PREFIX = "timing_s/"
STEP_TIME = "timing_s/step"
STALENESS_COUNT = re.compile(r"^async/staleness/count_(?P<age>\d+)$")
DROPPED_STALE = "async/dropped_stale"
# Phases timed inside another phase (child: parent); the parent's bar then shows only its
# own remainder. None today: the weight sync is its own step phase after the actor update
# (it was inside `gen` while generation synced lazily).
NESTED_PHASES: dict[str, str] = {}

__all__ = ["MetricsFileError", "load_metrics", "plot_metrics"]


class MetricsFileError(ValueError):
    """The metrics file is missing, empty or malformed; the message says which and where."""


# ---------------------------------------------------------------------------- reading


def resolve_metrics_path(path: str | Path) -> Path:
    """`path` itself when it is a file, `<path>/metrics.jsonl` when it is a run directory."""
    path = Path(path)
    if path.is_dir():
        candidate = path / METRICS_FILE
        if not candidate.is_file():
            raise MetricsFileError(
                f"{path} is a directory without {METRICS_FILE}; pass a run's trainer.default_local_dir "
                f"(the run must log with trainer.logger including 'file') or the file itself"
            )
        return candidate
    if not path.exists():
        raise MetricsFileError(f"{path} does not exist; pass a run directory or its {METRICS_FILE}")
    return path


def load_metrics(path: str | Path) -> list[dict[str, float | None]]:
    """The rows of a metrics file, one per step in step order, repeated steps merged.

    A truncated last line (a run killed mid-write) is skipped with a warning; any other
    line that is not a JSON object with an integer `step` is an error naming the line."""
    path = resolve_metrics_path(path)
    lines = path.read_text(encoding="utf-8").splitlines()
    by_step: dict[int, dict] = {}
    last_content = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            if i == last_content:
                warnings.warn(f"{path}:{i + 1}: skipping an incomplete last line ({err})", stacklevel=2)
                continue
            raise MetricsFileError(f"{path}:{i + 1}: not a JSON object ({err}): {line[:120]!r}") from err
        if not isinstance(row, dict):
            raise MetricsFileError(f"{path}:{i + 1}: expected a JSON object, got {type(row).__name__}")
        step = row.get("step")
        if isinstance(step, bool) or not isinstance(step, (int, float)) or step != int(step):
            raise MetricsFileError(f'{path}:{i + 1}: the row has no integer "step" (got {step!r})')
        by_step.setdefault(int(step), {}).update(row)
    if not by_step:
        raise MetricsFileError(f"{path} has no metric rows (is the run logging with trainer.logger including 'file'?)")
    return [dict(by_step[s], step=s) for s in sorted(by_step)]


def _value(row: dict, key: str) -> float:
    value = row.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return math.nan
    return float(value)


def _series(rows: list[dict], key: str) -> tuple[list[int], list[float]] | None:
    """(steps, values) over the rows that have a finite `key`; None when no row has one."""
    steps, values = [], []
    for row in rows:
        value = _value(row, key)
        if math.isfinite(value):
            steps.append(row["step"])
            values.append(value)
    return (steps, values) if steps else None


# ---------------------------------------------------------------------------- drawing


def _figure(nrows: int = 1, height: float = 3.6):
    # The object API with an explicit Agg canvas: no pyplot global state, no GUI backend,
    # and safe inside a trainer process that may have chosen another backend.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, height * nrows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, 1, squeeze=False)[:, 0]
    for ax in axes:
        _integer_steps(ax)
    return fig, list(axes)


def _integer_steps(ax) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("step")
    ax.grid(True, alpha=0.3)


def _save(fig, out_dir: Path, name: str) -> Path:
    path = out_dir / name
    fig.savefig(path, dpi=100)
    return path


def plot_reward(rows: list[dict], out_dir: Path) -> Path | None:
    score = _series(rows, SCORE)
    val_keys = sorted({k for row in rows for k in row if VAL_CORE.match(k)})
    val = [(k, s) for k in val_keys if (s := _series(rows, k)) is not None]
    if score is None and not val:
        return None
    fig, (ax,) = _figure()
    if score is not None:
        ax.plot(*score, label="train reward (critic/score/mean)", color="tab:blue")
        low, high = _series(rows, "critic/score/min"), _series(rows, "critic/score/max")
        if low is not None and high is not None and low[0] == high[0]:
            ax.fill_between(low[0], low[1], high[1], color="tab:blue", alpha=0.12, label="train min-max")
    colour = 1  # C0 is the training curve's blue; validation curves take the next colours
    for key, (steps, values) in val:
        m = VAL_CORE.match(key)
        ax.plot(steps, values, marker="o", color=f"C{colour % 10}", label=f"val {m['source']} {m['var']} mean@{m['n']}")
        colour += 1
        # The same number per question type (the rows' extra_info.subset), dashed.
        subset = re.compile(rf"^val-aux/{re.escape(m['source'])}/(?P<subset>[^/]+)/{m['var']}/mean@{m['n']}$")
        for sub_key in sorted({k for row in rows for k in row if subset.match(k)}):
            series = _series(rows, sub_key)
            if series is not None:
                ax.plot(
                    *series,
                    marker=".",
                    linestyle="--",
                    color=f"C{colour % 10}",
                    label=f"  {subset.match(sub_key)['subset']}",
                )
                colour += 1
    ax.set_title("reward and validation accuracy")
    ax.set_ylabel("reward / accuracy")
    ax.legend(loc="best", fontsize="small")
    return _save(fig, out_dir, "reward.png")


def plot_kl_entropy(rows: list[dict], out_dir: Path) -> Path | None:
    kl = [(k, s) for k in KL_KEYS if (s := _series(rows, k)) is not None]
    entropy = _series(rows, ENTROPY)
    panels = ([("kl", kl)] if kl else []) + ([("entropy", [(ENTROPY, entropy)])] if entropy else [])
    if not panels:
        return None
    fig, axes = _figure(len(panels), height=3.0)
    for ax, (title, series) in zip(axes, panels):
        for key, (steps, values) in series:
            ax.plot(steps, values, label=key)
        ax.set_title(title)
        ax.legend(loc="best", fontsize="small")
    return _save(fig, out_dir, "kl_entropy.png")


def plot_response_length(rows: list[dict], out_dir: Path) -> Path | None:
    series = [(k, s) for k in LENGTH_KEYS if (s := _series(rows, k)) is not None]
    if not series:
        return None
    fig, (ax,) = _figure()
    for key, (steps, values) in series:
        ax.plot(steps, values, label=key, linestyle="-" if key.endswith("mean") else "--")
    ax.set_title("response length")
    ax.set_ylabel("tokens")
    ax.legend(loc="best", fontsize="small")
    return _save(fig, out_dir, "response_length.png")


def _phase_seconds(row: dict, phases: list[str]) -> dict[str, float]:
    """Bar heights of one step: missing or non-finite phases are 0, nested time removed."""
    seconds = {}
    for phase in phases:
        value = _value(row, TIMING_PREFIX + phase)
        seconds[phase] = max(value, 0.0) if math.isfinite(value) else 0.0
    for child, parent in NESTED_PHASES.items():
        if child in seconds and parent in seconds:
            seconds[parent] = max(seconds[parent] - seconds[child], 0.0)
    return seconds


def plot_timing(rows: list[dict], out_dir: Path) -> Path | None:
    import matplotlib

    timed_rows = [r for r in rows if any(k.startswith(TIMING_PREFIX) for k in r)]
    phases = list(
        dict.fromkeys(
            k[len(TIMING_PREFIX) :] for r in timed_rows for k in r if k.startswith(TIMING_PREFIX) and k != STEP_TIME
        )
    )
    step_time = _series(timed_rows, STEP_TIME)
    if not phases and step_time is None:
        return None
    fig, (ax,) = _figure(height=4.2)
    steps = [r["step"] for r in timed_rows]
    per_row = [_phase_seconds(r, phases) for r in timed_rows]
    bottom = [0.0] * len(timed_rows)
    colors = matplotlib.colormaps["tab20"]
    for i, phase in enumerate(phases):
        heights = [s[phase] for s in per_row]
        nested = [child for child, parent in NESTED_PHASES.items() if parent == phase and child in phases]
        label = f"{phase} (excl. {', '.join(nested)})" if nested else phase
        ax.bar(steps, heights, bottom=bottom, width=0.8, label=label, color=colors(i % 20))
        bottom = [b + h for b, h in zip(bottom, heights)]
    if step_time is not None:
        ax.plot(*step_time, color="black", marker=".", label="step (wall)")
    ax.set_title("time per phase")
    ax.set_ylabel("seconds")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    return _save(fig, out_dir, "timing.png")


def plot_staleness(rows: list[dict], out_dir: Path) -> Path | None:
    ages = sorted({int(m["age"]) for row in rows for k in row if (m := STALENESS_COUNT.match(k))})
    if not ages:
        return None
    counted = [r for r in rows if any(STALENESS_COUNT.match(k) for k in r)]
    steps = [r["step"] for r in counted]
    fig, (per_step, whole_run) = _figure(2, height=3.0)
    bottom = [0.0] * len(counted)
    totals = []
    for i, age in enumerate(ages):
        # A step that trained no sample of this age has no key for it: 0, not missing.
        heights = [v if math.isfinite(v := _value(r, f"async/staleness/count_{age}")) else 0.0 for r in counted]
        per_step.bar(steps, heights, bottom=bottom, width=0.8, color=f"C{i % 10}", label=f"{age} behind")
        bottom = [b + h for b, h in zip(bottom, heights)]
        totals.append(sum(heights))
    per_step.set_title("samples trained per step, by staleness (weight versions behind)")
    per_step.set_ylabel("samples")
    per_step.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    whole_run.bar(ages, totals, width=0.6, color=[f"C{i % 10}" for i in range(len(ages))])
    whole_run.set_xlabel("staleness (weight versions behind)")
    whole_run.set_ylabel("samples")
    dropped = _series(rows, DROPPED_STALE)
    title = "the run's staleness histogram"
    if dropped is not None:
        title += f"; groups dropped as too stale: {int(dropped[1][-1])}"
    whole_run.set_title(title)
    return _save(fig, out_dir, "staleness.png")


PLOTS = (plot_reward, plot_kl_entropy, plot_response_length, plot_timing, plot_staleness)


def plot_metrics(metrics_path: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """Write the PNGs for the run at `metrics_path` (a run directory or its metrics.jsonl)
    into `out_dir` (default: `plots/` next to the file); return the paths written.

    Raises MetricsFileError when the file is missing, empty or malformed."""
    path = resolve_metrics_path(metrics_path)
    rows = load_metrics(path)
    out = Path(out_dir) if out_dir is not None else path.parent / DEFAULT_SUBDIR
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for plot in PLOTS:
        result = plot(rows, out)
        if result is not None:
            written.append(result)
    return written
