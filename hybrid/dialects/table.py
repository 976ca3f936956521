"""The machinery shared by the dialect front-ends: mapping rules as data, and the
translation of a set of dialect keys into verl `key=value` overrides.

A dialect (SkyRL, ROLL) is a list of `Rule`s. Each rule names one dialect key (or a family
of keys: `<name>` stands for any one segment, a trailing `.*` for anything below), the verl
keys it writes, a `convert` function that turns the dialect value into those verl values
(or raises `Refusal` with the reason), and a line of text for the generated documentation
(docs/config_dialects.md, from scripts/gen_config_dialects_doc.py). Three kinds:

- `map`: the value becomes one or more verl values, transformed where units or names differ;
- `refuse`: hybrid has no equivalent; every value is refused, or every value but the ones
  hybrid already behaves like (`trainer.placement.colocate_all=true` is accepted);
- `ignore`: the key only tunes machinery hybrid does not have (a log folder, a remote-engine
  URL's update group); any value is accepted and nothing is written.

Keys a user does not give take the dialect's own defaults where the dialect says so
(`Dialect.fill`: SkyRL, whose launch scripts rely on SkyRL's defaults): each such key of
`Dialect.defaults` that has a `map` rule and is not in `Dialect.unfilled` is translated with its
default value, as if given, after the keys given; a verl key a given key writes keeps the given
key's value, and a filled value equal to hybrid's default writes nothing. Other keys take
hybrid's defaults (hybrid/config/ppo_trainer.yaml). A rule whose meaning depends on another
dialect key reads that key through the `Context`: the value given, else the filled default,
else the value that will apply in hybrid (`Context.effective`), else the dialect's own default
where hybrid has no such key (`Context.get`).

`translate` collects every problem (an unknown key with the nearest known one, a refused
key with its reason, two keys that would set one verl key to different values) and raises
one ConfigError listing them all, one line each.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from hybrid.config import ConfigError, default_config, suggest_keys
from hybrid.config.override_values import hydra_value

Convert = Callable[[Any, "Context"], dict[str, Any]]

# A dual-clip bound no advantage reaches: hybrid's `vanilla` loss always applies verl's dual
# clip (`clip_ratio_c`), so a plain PPO clip (SkyRL's `regular`, ROLL without
# `dual_clip_loss`) is this bound, which never binds.
NO_DUAL_CLIP = 1.0e9

MISSING = object()


class Refusal(Exception):
    """Raised by a rule's convert: the value has no equivalent in hybrid; the text says why.

    `shared`: several keys are read together (ROLL's advantage settings) and each would
    report the same combination; the problem is listed once.
    """

    def __init__(self, reason: str, shared: bool = False):
        super().__init__(reason)
        self.shared = shared


@dataclass(frozen=True)
class Rule:
    key: str
    verl: tuple[str, ...]
    convert: Convert
    how: str
    note: str = ""
    kind: str = "map"  # map | refuse | ignore
    accepts: str = ""  # refuse rules: the values that are accepted (hybrid already behaves so)

    @functools.cached_property
    def pattern(self) -> re.Pattern | None:
        if "<" not in self.key and not self.key.endswith(".*"):
            return None
        body = self.key[:-2] if self.key.endswith(".*") else self.key
        regex = re.escape(body)
        regex = re.sub(r"<[^>]+>", "[^.]+", regex.replace(r"\<", "<").replace(r"\>", ">"))
        if self.key.endswith(".*"):
            regex += r"(\..+)?"
        return re.compile(regex + r"\Z")

    @functools.cached_property
    def prefix_length(self) -> int:
        """How specific a pattern rule is: the length of its literal start."""
        return len(re.split(r"<|\.\*$", self.key)[0])


class Context:
    """What a convert function may read besides its own value."""

    def __init__(
        self, given: Mapping[str, Any], dialect_defaults: Mapping[str, Any], filled: Mapping[str, Any] | None = None
    ):
        self.given = dict(given)
        self.dialect_defaults = dict(dialect_defaults)
        self.filled = dict(filled or {})
        self.key = ""

    def has(self, key: str) -> bool:
        """Whether the user gave the key."""
        return key in self.given

    def known(self, key: str) -> bool:
        """Whether the key's value is the dialect's: given, or filled with the dialect's default."""
        return key in self.given or key in self.filled

    def get(self, key: str, default: Any = MISSING) -> Any:
        """The value given for a dialect key, else the dialect's default for it."""
        if key in self.given:
            return self.given[key]
        if key in self.dialect_defaults:
            return self.dialect_defaults[key]
        if default is MISSING:
            raise KeyError(f"no default for dialect key {key!r}")
        return default

    def effective(self, key: str, verl_key: str) -> Any:
        """The value that applies in hybrid for a dialect key with the same units as
        `verl_key`: the one given, else the dialect's default filled in, else hybrid's default
        for `verl_key`."""
        if key in self.given:
            return self.given[key]
        if key in self.filled:
            return self.filled[key]
        return hybrid_default(verl_key)


def hybrid_default(verl_key: str) -> Any:
    """hybrid's default for a verl key (ppo_trainer.yaml; only keys without a default asset)."""
    value = OmegaConf.select(_defaults(), verl_key, default=MISSING)
    if value is MISSING:
        raise KeyError(f"{verl_key} is not a key of ppo_trainer.yaml")
    return _plain(value)


@functools.lru_cache(maxsize=1)
def _defaults() -> DictConfig:
    return default_config()


def _plain(value: Any) -> Any:
    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    return value


# ---------------------------------------------------------------- rule constructors


def same(key: str, *verl: str, note: str = "") -> Rule:
    """The value, unchanged, into each verl key."""
    return Rule(key, verl, lambda value, ctx: {v: value for v in verl}, "same value", note)


def via(key: str, verl: str | tuple[str, ...], fn: Callable[[Any, Context], Any], how: str, note: str = "") -> Rule:
    """`fn(value, ctx)` into one verl key (or the same result into several)."""
    targets = (verl,) if isinstance(verl, str) else tuple(verl)
    return Rule(key, targets, lambda value, ctx: {v: fn(value, ctx) for v in targets}, how, note)


def custom(key: str, verl: tuple[str, ...], convert: Convert, how: str, note: str = "") -> Rule:
    """A convert that returns the verl assignments itself (several keys, or none)."""
    return Rule(key, tuple(verl), convert, how, note)


def choice(
    key: str,
    verl: str | tuple[str, ...],
    values: Mapping[Any, Any],
    refused: Mapping[Any, str] | None = None,
    note: str = "",
) -> Rule:
    """A value from a fixed list, renamed; values in `refused` fail with their reason."""
    targets = (verl,) if isinstance(verl, str) else tuple(verl)
    refused = dict(refused or {})

    def convert(value: Any, ctx: Context) -> dict[str, Any]:
        if _hashable(value) and value in values:
            return {v: values[value] for v in targets}
        if _hashable(value) and value in refused:
            raise Refusal(refused[value])
        supported = ", ".join(show(v) for v in values)
        raise Refusal(f"not a value hybrid can take; supported: {supported}")

    how = ", ".join(f"{show(a)} -> {show(b)}" if a != b else show(a) for a, b in values.items())
    if refused:
        how += "; refused: " + ", ".join(show(v) for v in refused)
    return Rule(key, targets, convert, how, note)


def refuse(
    key: str, reason: str, accept: Iterable[Any] | Callable[[Any], bool] | None = None, accepts: str = ""
) -> Rule:
    """No equivalent: every value fails with `reason`, except the accepted ones (the values
    that describe what hybrid does anyway), which write nothing."""
    if accept is None:
        ok: Callable[[Any], bool] = lambda value: False  # noqa: E731
    elif callable(accept):
        ok = accept
    else:
        allowed = list(accept)
        ok = lambda value: any(_equal(value, a) for a in allowed)  # noqa: E731
        accepts = accepts or ", ".join(show(a) for a in allowed)

    def convert(value: Any, ctx: Context) -> dict[str, Any]:
        if ok(value):
            return {}
        raise Refusal(reason)

    return Rule(key, (), convert, "", reason, kind="refuse", accepts=accepts)


def ignore(key: str, note: str) -> Rule:
    """Accepted with any value; tunes machinery hybrid does not have, so writes nothing."""
    return Rule(key, (), lambda value, ctx: {}, "", note, kind="ignore")


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def _equal(a: Any, b: Any) -> bool:
    # `1 == True` in Python; a dialect's `true` is not the number 1.
    return type(a) is type(b) and a == b if isinstance(a, bool) or isinstance(b, bool) else a == b


# ---------------------------------------------------------------- values and overrides


def show(value: Any) -> str:
    """A value as a user would write it in YAML or on a command line."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(show(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {show(v)}" for k, v in value.items()) + "}"
    return str(value)


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """`{"a": {"b": 1}}` -> `{"a.b": 1}`; lists and empty dicts are leaves."""
    flat: dict[str, Any] = {}
    for name, value in tree.items():
        path = f"{prefix}.{name}" if prefix else str(name)
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, path))
        else:
            flat[path] = value
    return flat


# ---------------------------------------------------------------- translation


@dataclass(frozen=True)
class Dialect:
    """One dialect's rules, its legacy key names, its defaults for keys hybrid has no
    equivalent of, and overrides it always sets (hybrid extras the dialect does not do)."""

    name: str
    rules: tuple[Rule, ...]
    aliases: Mapping[str, str]
    defaults: Mapping[str, Any]
    always: Mapping[str, Any]
    always_why: str
    notes: tuple[str, ...] = ()
    fill: bool = False  # keys not given take `defaults` (map rules only, `unfilled` excepted)
    unfilled: Mapping[str, str] = dataclasses.field(default_factory=dict)  # key (or `prefix.*`) -> why not

    @functools.cached_property
    def exact(self) -> dict[str, Rule]:
        exact = {r.key: r for r in self.rules if r.pattern is None}
        if len(exact) != len([r for r in self.rules if r.pattern is None]):
            raise ValueError(f"{self.name}: two rules for the same key")
        return exact

    @functools.cached_property
    def patterns(self) -> list[Rule]:
        return sorted((r for r in self.rules if r.pattern is not None), key=lambda r: -r.prefix_length)

    def canonical(self, key: str) -> str:
        if key in self.aliases:
            return self.aliases[key]
        for old, new in self.aliases.items():
            if old.endswith(".") and key.startswith(old):
                return new + key[len(old) :]
        return key

    def rule_for(self, key: str) -> Rule | None:
        if key in self.exact:
            return self.exact[key]
        for rule in self.patterns:
            if rule.pattern.match(key):
                return rule
        return None

    def is_section(self, key: str) -> bool:
        """True when rules exist below `key` (a null or empty section is simply absent)."""
        start = key + "."
        return any(r.key.startswith(start) for r in self.rules) or any(a.startswith(start) for a in self.aliases)

    def filled_keys(self, given: Iterable[str]) -> dict[str, Any]:
        """The keys of `defaults` that take their default here: not given (nor a section above
        or below one given), with a `map` rule, not in `unfilled`."""
        if not self.fill:
            return {}
        given = list(given)
        out = {}
        for key, value in self.defaults.items():
            if any(key == g or key.startswith(g + ".") or g.startswith(key + ".") for g in given):
                continue
            if key in self.unfilled or any(u.endswith(".*") and key.startswith(u[:-1]) for u in self.unfilled):
                continue
            rule = self.rule_for(key)
            if rule is not None and rule.kind == "map":
                out[key] = value
        return out

    def known_keys(self) -> list[str]:
        return [r.key for r in self.rules] + [a for a in self.aliases if not a.endswith(".")]


def translate(dialect: Dialect, given: Mapping[str, Any], order: Iterable[str] | None = None) -> list[str]:
    """Translate flat dialect keys (`{"trainer.seed": 1, ...}`) into verl overrides.

    Values are plain Python values, already resolved. Raises ConfigError listing every
    problem. The overrides come out in the order the keys were given, each verl key once.
    """
    problems: list[str] = []
    canonical: dict[str, Any] = {}
    shown: dict[str, str] = {}

    def put(name: str, value: Any, written: str) -> None:
        # An older spelling and the newer key both given: the dialect refuses two values too.
        if name in canonical and shown[name] != written and canonical[name] != value:
            problems.append(
                f"{shown[name]}={show(canonical[name])} and {written}={show(value)} are one setting "
                "(an older and a newer spelling) with different values; give one of them"
            )
        canonical[name], shown[name] = value, written

    for key in order or given:
        value = given[key]
        name = dialect.canonical(key)
        if dialect.rule_for(name) is None and isinstance(value, Mapping) and value:
            # A whole section given as one value: its leaves are the keys.
            for sub, sub_value in flatten(value, key).items():
                put(dialect.canonical(sub), sub_value, sub)
            continue
        put(name, value, key)

    filled = dialect.filled_keys(canonical)
    ctx = Context(canonical, dialect.defaults, filled)
    assigned: dict[str, tuple[Any, str]] = {}
    shared_reasons: set[str] = set()
    by_default = f"{dialect.name}'s default; the key is not given"
    for name, value in [*canonical.items(), *filled.items()]:
        default = name not in canonical
        written = name if default else shown[name]
        label = f"{written}={show(value)}" + (f" ({by_default})" if default else "")
        rule = dialect.rule_for(name)
        if rule is None:
            if value is None or value == {} or value == []:
                if dialect.is_section(name):
                    continue
            problems.append(_unknown(dialect, written, name, value))
            continue
        ctx.key = name
        try:
            result = rule.convert(value, ctx)
        except Refusal as refusal:
            if refusal.shared:
                if str(refusal) in shared_reasons:
                    continue
                shared_reasons.add(str(refusal))
            problems.append(f"{label}: {refusal}")
            continue
        if default:  # a verl key a given key wrote keeps its value; hybrid's own default writes nothing
            result = {k: v for k, v in result.items() if k not in assigned and not _is_hybrid_default(k, v)}
        for verl_key, verl_value in result.items():
            if verl_key in assigned and not _equal(assigned[verl_key][0], verl_value):
                other_value, other = assigned[verl_key]
                problems.append(
                    f"{other} and {label} both set {verl_key}, to different values "
                    f"({show(other_value)} and {show(verl_value)}); hybrid has one key for both"
                )
                continue
            assigned.setdefault(verl_key, (verl_value, label))
    if problems:
        count = len(problems)
        header = (
            f"the {dialect.name} configuration cannot be run by hybrid "
            f"({count} problem{'s' if count > 1 else ''}; docs/config_dialects.md lists every key):"
        )
        raise ConfigError("\n".join([header] + [f"  - {p}" for p in problems]))
    overrides = [f"{k}={hydra_value(v)}" for k, v in dialect.always.items() if k not in assigned]
    overrides += [f"{k}={hydra_value(v)}" for k, (v, _) in assigned.items()]
    return overrides


def _is_hybrid_default(verl_key: str, value: Any) -> bool:
    """Whether `value` is what ppo_trainer.yaml sets `verl_key` to. A default that interpolates
    another key (`critic.model.path: ${actor_rollout_ref.model.path}`) depends on the line: never."""
    parent_key, _, leaf = verl_key.rpartition(".")
    try:
        parent = OmegaConf.select(_defaults(), parent_key, default=None) if parent_key else _defaults()
        if not isinstance(parent, DictConfig) or leaf not in parent or OmegaConf.is_interpolation(parent, leaf):
            return False
        return _equal(_plain(parent[leaf]), value)
    except OmegaConfBaseException:  # a default read from an asset (`${hybrid_default:...}`): no plain value
        return False


def _unknown(dialect: Dialect, written: str, name: str, value: Any) -> str:
    near = suggest_keys(name, dialect.known_keys())
    if near:
        hint = f"did you mean {near[0]}?"
        if len(near) > 1:
            hint += f" (other near keys: {', '.join(near[1:])})"
    else:
        hint = "no similar key is known"
    return f"{written}={show(value)}: not a {dialect.name} key hybrid knows; {hint}"


__all__ = [
    "Context",
    "Dialect",
    "MISSING",
    "NO_DUAL_CLIP",
    "Refusal",
    "Rule",
    "choice",
    "custom",
    "flatten",
    "hybrid_default",
    "hydra_value",
    "ignore",
    "refuse",
    "same",
    "show",
    "translate",
    "via",
]
