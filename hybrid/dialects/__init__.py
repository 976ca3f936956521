"""Configuration dialects: start hybrid with SkyRL's or ROLL's own keys.

`translate_argv` runs first in `python -m hybrid.main_ppo`. It takes the command line
(without the program name) and returns it in verl keys, so everything after it (the key
check, Hydra, `--cfg job`) sees an ordinary hybrid command line:

    --dialect verl            the default: the line is returned unchanged, minus the flag
    --dialect skyrl           every key=value is a SkyRL key (hybrid/dialects/skyrl.py)
    --roll-config PATH.yaml   a ROLL pipeline YAML; every key=value is a ROLL dotted key
                              applied onto the file before translation (as ROLL's own Hydra
                              launcher would; keys not in the file need +key=value)
                              (hybrid/dialects/roll.py; `--dialect roll` may be added)

Hydra's own flags (`--cfg job`, `--help`, `-m`, ...) and `hydra.*` overrides pass through
unchanged, so `--dialect skyrl ... --cfg job` prints the resulting config in verl keys.
A key with no equivalent raises ConfigError listing every such key with the reason;
docs/config_dialects.md (generated from the rule tables) lists every key of each dialect.
"""

from __future__ import annotations

from hybrid.config import ConfigError

DIALECTS = ("verl", "skyrl", "roll")


def _take_option(argv: list[str], name: str) -> tuple[list[str], list[str]]:
    """Remove every `name VALUE` / `name=VALUE` from argv; returns (rest, values)."""
    rest, values, i = [], [], 0
    while i < len(argv):
        arg = argv[i]
        if arg == name:
            if i + 1 >= len(argv):
                raise ConfigError(f"{name} needs a value")
            values.append(argv[i + 1])
            i += 2
            continue
        if arg.startswith(name + "="):
            values.append(arg[len(name) + 1 :])
        else:
            rest.append(arg)
        i += 1
    return rest, values


def _split_overrides(argv: list[str]) -> tuple[list[str], list[str]]:
    """(Hydra's flags with their values, the key=value overrides), each in order."""
    # Hydra's own parser (hydra.main uses the same one) tells overrides from its flags.
    from hydra._internal.utils import get_args_parser

    # Intermixed: a dialect line may put `--cfg job` between its keys; the result is
    # written flags first, overrides after, which Hydra accepts.
    overrides = list(get_args_parser().parse_intermixed_args(argv).overrides)
    flags, pending = [], list(overrides)
    for arg in argv:
        if pending and arg == pending[0]:
            pending.pop(0)
        else:
            flags.append(arg)
    return flags, overrides


def translate_argv(argv: list[str]) -> list[str]:
    """The command line with dialect keys replaced by verl overrides (see the module doc)."""
    argv, dialects = _take_option(list(argv), "--dialect")
    argv, roll_configs = _take_option(argv, "--roll-config")
    if len(set(dialects)) > 1:
        raise ConfigError(f"--dialect given more than once with different values: {', '.join(dialects)}")
    if len(roll_configs) > 1:
        raise ConfigError("--roll-config given more than once; give one ROLL pipeline YAML")
    dialect = dialects[0] if dialects else ("roll" if roll_configs else "verl")
    if dialect not in DIALECTS:
        raise ConfigError(f"--dialect {dialect}: not a dialect hybrid speaks; choose one of {', '.join(DIALECTS)}")
    if roll_configs and dialect != "roll":
        raise ConfigError(f"--roll-config reads ROLL keys and cannot be combined with --dialect {dialect}")
    if dialect == "roll" and not roll_configs:
        raise ConfigError("--dialect roll needs --roll-config PATH.yaml (the ROLL pipeline file)")
    if dialect == "verl":
        return argv
    flags, overrides = _split_overrides(argv)
    if dialect == "skyrl":
        from hybrid.dialects.skyrl import translate_skyrl

        return flags + translate_skyrl(overrides)
    from hybrid.dialects.roll import translate_roll

    return flags + translate_roll(roll_configs[0], overrides)


__all__ = ["DIALECTS", "translate_argv"]
