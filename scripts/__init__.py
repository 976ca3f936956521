"""Tools: model merger, metric plots, benchmarks."""
