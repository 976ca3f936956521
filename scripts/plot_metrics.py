"""Command line for hybrid/plots.py: PNG plots of a run's metrics.jsonl.

    python -m scripts.plot_metrics checkpoints/hybrid/arithmetic_grpo [--out DIR]
    python -m scripts.plot_metrics path/to/metrics.jsonl

Exit status 2 for a missing, empty or malformed file, 1 when none of the plotted
metrics is present.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Iterable

from hybrid.plots import DEFAULT_SUBDIR, MetricsFileError, load_metrics, plot_metrics

__all__ = ["MetricsFileError", "load_metrics", "plot_metrics", "main"]


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m scripts.plot_metrics", description="PNG plots from a run's metrics.jsonl"
    )
    parser.add_argument("path", help="a run directory (trainer.default_local_dir) or a metrics.jsonl file")
    parser.add_argument("--out", default=None, help=f"output directory (default: {DEFAULT_SUBDIR}/ next to the file)")
    args = parser.parse_args(None if argv is None else list(argv))
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            written = plot_metrics(args.path, args.out)
    except MetricsFileError as err:
        print(f"plot_metrics: error: {err}", file=sys.stderr)
        return 2
    for warning in caught:
        # one plain line each, not Python's file:line warning format
        print(f"plot_metrics: warning: {warning.message}", file=sys.stderr)
    if not written:
        print(f"plot_metrics: nothing to plot: {args.path} has none of the plotted metrics", file=sys.stderr)
        return 1
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
