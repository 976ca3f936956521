"""Turning responses into scores: scorers, reward managers, custom reward loading."""
