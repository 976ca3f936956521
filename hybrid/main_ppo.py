"""The user entry point: `python -m hybrid.main_ppo key=value ...`.

Before Hydra runs, override keys on the command line are checked against the default
configuration (a typo names the nearest real key) and free-form keys are rewritten so Hydra
accepts them. Hydra then composes `config/ppo_trainer.yaml` (`--cfg job` prints it without
resolving anything); `main` turns the result into the frozen, checked `HybridConfig`
(hybrid/config/validate.py: plug-ins imported, every problem listed) and hands it to
`run_ppo`. Before that, `hybrid.preflight.check_inputs` looks at the model folders, data
files and reward function the config names, so a wrong path or a data file without the
prompt column fails in seconds, every such problem listed at once.

Every failure ends in hybrid/errors.py: one `hybrid: ...` message on stderr and exit
status 2 (found before training starts) or 1 (during training), no traceback unless the
user's own code raised (then cut to its frames) or HYBRID_DEBUG=1. SIGTERM and Ctrl-C stop
the run (hybrid/interrupts.py): at once while it loads, at the next safe point once it
trains (saving a checkpoint), with status 143 or 130.
"""

from __future__ import annotations

import os
import sys

import hydra
from omegaconf import DictConfig

from hybrid.config import (
    CONFIG_NAME,
    HybridConfig,
    check_override_keys,
    default_config,
    normalize_overrides,
    typed_config,
)
from hybrid.config.loading import rewrite_foreign_overrides
from hybrid.defaults import register_resolvers
from hybrid.errors import exit_on_error, reset_phase
from hybrid.interrupts import StopSignals
from hybrid.preflight import check_inputs


def run_ppo(config: HybridConfig) -> None:
    """Build data, reward, worker groups and train; implemented in hybrid/run.py."""
    from hybrid.run import run_ppo as _run

    _run(config)


@hydra.main(config_path="config", config_name="ppo_trainer", version_base=None)
def main(config: DictConfig) -> None:
    # Failures are reported here, inside Hydra's task function: Hydra's own report would
    # print a traceback through its frames and bury the message.
    with exit_on_error(), StopSignals(defer=False):
        typed = typed_config(config)
        check_inputs(typed)
        run_ppo(typed)


def prepare_command_line(argv: list[str]) -> list[str]:
    """Check the overrides in `argv` (without the program name) and return `argv` with
    them normalized for Hydra; raises ConfigError for unknown keys."""
    # Hydra's own parser (hydra.main uses the same one) tells overrides from its flags.
    from hydra._internal.utils import get_args_parser

    args = get_args_parser().parse_args(argv)
    if args.config_path or args.config_dir:
        # Another config tree: its keys are not ours to check; Hydra still rejects unknown keys.
        return list(argv)
    overrides, note = rewrite_foreign_overrides(args.overrides)
    if note:
        print(f"hybrid: {note}", file=sys.stderr, flush=True)
    defaults = default_config(args.config_name or CONFIG_NAME)
    check_override_keys(overrides, defaults)
    normalized = normalize_overrides(overrides, defaults)
    # Hydra's flags keep their place; the overrides (some rewritten, some removed) follow them,
    # which Hydra accepts. Overrides are positional, so they appear in argv in argparse's order.
    flags, pending = [], list(args.overrides)
    for arg in argv:
        if pending and arg == pending[0]:
            pending.pop(0)
        else:
            flags.append(arg)
    return flags + normalized


def cli() -> None:
    # Before torch loads: vLLM's CPU backend drops to one thread unless this is set.
    os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))
    reset_phase()
    with exit_on_error():
        # SkyRL keys (--dialect skyrl) and ROLL pipeline files (--roll-config) become verl keys first.
        from hybrid.dialects import translate_argv

        sys.argv[1:] = translate_argv(sys.argv[1:])
        register_resolvers()
        sys.argv[1:] = prepare_command_line(sys.argv[1:])
    main()


if __name__ == "__main__":
    cli()
