"""The driver: entry point, config, trainer loop, algorithms, metrics."""
