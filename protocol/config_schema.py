"""How a config section is declared and checked: the language of the typed config.

The driver's config (hybrid/config) composes sections that each owner declares: the
workers theirs (workers/config), the reward package its own (reward/config.py). A section is
a frozen dataclass whose fields are the yaml's keys: its type, and with `typing.Annotated`
the constraint on its value (`Positive`, `NonNegative`, `Fraction`, `Range`, `OneOf`,
`Fixed`). `build_section` walks a plain container (the resolved yaml tree) against a class,
records one line per bad value, unknown key or missing key, and still builds the object (a
bad value is stored as INVALID) so that the cross-key checks of every section run too and
the user sees every problem at once. The yaml is the one place defaults live: no key field
has a default. A `derived()` field is not a key: the driver fills it once from other
sections (a mini-batch in samples per rank, say) so the worker reads it instead of
recomputing it. It lives here, below driver and workers, because both sides speak it.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Annotated, Any, Union, get_args, get_origin, get_type_hints

__all__ = [
    "INVALID",
    "OptionalPositiveInt",
    "Paths",
    "PositiveInt",
    "derived",
    "is_derived",
    "valid",
    "Annotated",
    "AsList",
    "AtLeast",
    "Fixed",
    "Fraction",
    "NonNegative",
    "OneOf",
    "Positive",
    "Problems",
    "Range",
    "build_section",
    "fmt",
    "section_fields",
    "section_names",
]


class _Invalid:
    """Stands in for a value that failed its check; cross-key checks skip keys holding it."""

    _instance = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "INVALID"

    def __reduce__(self):
        return (_Invalid, ())


INVALID = _Invalid()


def valid(*values: Any) -> bool:
    """True when none of `values` failed its own check (cross-key rules skip those)."""
    return all(v is not INVALID for v in values)


def derived(default: Any = None) -> Any:
    """A field that is not a yaml key: the driver's config fills it from other sections."""
    return dataclasses.field(default=default, metadata={"derived": True})


def is_derived(field: dataclasses.Field) -> bool:
    return bool(field.metadata.get("derived"))


@dataclass(frozen=True)
class Positive:
    """An integer (or number) > 0."""


@dataclass(frozen=True)
class NonNegative:
    """A number >= 0."""

    note: str = ""


@dataclass(frozen=True)
class AtLeast:
    """A number >= `bound` (> `bound` when `strict`)."""

    bound: float
    strict: bool = False
    note: str = ""


@dataclass(frozen=True)
class Fraction:
    """A number in [low, high] (by default [0, 1]); `open_low` excludes the lower end."""

    low: float = 0.0
    high: float = 1.0
    open_low: bool = False


Range = Fraction  # the same rule over another interval reads better under this name


@dataclass(frozen=True)
class Fixed:
    """A verl key hybrid accepts only at the values that need no feature it lacks.

    verl scripts set these keys; a script that leaves them at such a value runs unchanged,
    any other value is refused with `reason` instead of being silently ignored.
    """

    allowed: tuple
    reason: str


@dataclass(frozen=True)
class AsList:
    """A list key that also takes one item alone (`trainer.logger=console`, as verl scripts write)."""


@dataclass(frozen=True)
class OneOf:
    """One of the names `choices()` returns (a registry's keys, usually).

    `unsupported` names values verl (or SkyRL, ROLL) has and hybrid does not, with the
    reason; `suffix` lets `<name>+`-style variants through (checked by the section).
    """

    choices: Callable[[], Iterable[str]]
    unsupported: tuple[tuple[str, str], ...] = ()


def fmt(value: Any) -> str:
    """A value as messages show it: strings quoted, everything else as Python prints it."""
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, tuple):
        return str(list(value))
    return str(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class Problems(list):
    """One line per problem, in the order found, without repeats."""

    def add(self, message: str) -> None:
        if message not in self:
            self.append(message)


def section_fields(cls: type) -> dict[str, Any]:
    """Key name -> annotation (with Annotated extras) of a section class; derived fields are not keys."""
    hints = get_type_hints(cls, include_extras=True)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if not is_derived(f)}


def section_names(cls: type) -> tuple[str, ...]:
    """The fields of `cls` that hold a section (a dataclass) rather than a value."""
    names = []
    for name, annotation in section_fields(cls).items():
        alternatives, _ = _options(_split(annotation)[0])
        if any(dataclasses.is_dataclass(alt) for alt in alternatives):
            names.append(name)
    return tuple(names)


def _split(annotation: Any) -> tuple[Any, tuple]:
    if get_origin(annotation) is Annotated:
        base, *extras = get_args(annotation)
        return base, tuple(extras)
    return annotation, ()


def _options(annotation: Any) -> tuple[list[Any], bool]:
    """The alternatives of a union and whether None is one of them."""
    if get_origin(annotation) in (Union, types.UnionType):
        args = list(get_args(annotation))
        return [a for a in args if a is not type(None)], type(None) in args
    return [annotation], False


def _describe(alternatives: list[Any]) -> str:
    words = []
    for alt in alternatives:
        origin = get_origin(alt)
        if alt is bool:
            words.append("true or false")
        elif alt is int:
            words.append("an integer")
        elif alt is float:
            words.append("a number")
        elif alt is str:
            words.append("a string")
        elif origin in (list, tuple):
            words.append("a list")
        elif origin is dict or alt is dict:
            words.append("a mapping")
        elif dataclasses.is_dataclass(alt):
            words.append("a section")
        else:
            words.append(str(alt))
    return " or ".join(words)


def _convert(value: Any, annotation: Any) -> tuple[bool, Any]:
    """(True, converted) when `value` fits the (non-union, non-dataclass) annotation."""
    origin = get_origin(annotation)
    if annotation is Any:
        return True, value
    if annotation is bool:
        return isinstance(value, bool), value
    if annotation is int:
        return _is_int(value), value
    if annotation is float:
        return _is_number(value), float(value) if _is_number(value) else value
    if annotation is str:
        # Hydra reads `experiment_name=2024` as an int; a name is still meant.
        if isinstance(value, str):
            return True, value
        return (_is_number(value), str(value))
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            return False, value
        (item,) = get_args(annotation)[:1] or (Any,)
        item = _split(item)[0]
        items = []
        for element in value:
            ok, converted = _convert(element, item)
            if not ok:
                return False, value
            items.append(converted)
        return True, tuple(items)
    if origin is dict or annotation is dict:
        return isinstance(value, dict), dict(value) if isinstance(value, dict) else value
    raise TypeError(f"unsupported annotation {annotation!r}")


def _constraint_problem(key: str, value: Any, extras: tuple, allow_none: bool, shown: Any = None) -> str | None:
    """The problem with `value` (None if it passes); messages show `shown`, what the user wrote."""
    tail = " or null" if allow_none else ""
    problem = _first_problem(key, value, extras, tail)
    if problem and shown is not None and shown is not value:
        problem = problem.replace(f"{key}={fmt(value)}", f"{key}={fmt(shown)}", 1)
    return problem


def _first_problem(key: str, value: Any, extras: tuple, tail: str) -> str | None:
    for extra in extras:
        if isinstance(extra, Positive):
            if not _is_number(value) or value <= 0:
                kind = "a positive integer" if _is_int(value) or not _is_number(value) else "a positive number"
                return f"{key}={fmt(value)} must be {kind}{tail}"
        elif isinstance(extra, NonNegative):
            if value < 0:
                kind = "an integer" if _is_int(value) else "a number"
                return f"{key}={fmt(value)} must be {kind} >= 0{extra.note}"
        elif isinstance(extra, AtLeast):
            if value < extra.bound or (extra.strict and value == extra.bound):
                sign = ">" if extra.strict else ">="
                return f"{key}={fmt(value)} must be {sign} {extra.bound:g}{extra.note}"
        elif isinstance(extra, Fraction):
            low_ok = value > extra.low if extra.open_low else value >= extra.low
            if not (low_ok and value <= extra.high):
                bracket = "(" if extra.open_low else "["
                return f"{key}={fmt(value)} must be in {bracket}{extra.low:g}, {extra.high:g}]"
        elif isinstance(extra, Fixed):
            if value not in extra.allowed:
                allowed = " or ".join(fmt(v) for v in extra.allowed)
                return f"{key}={fmt(value)} is not supported: {extra.reason}; use {allowed}"
        elif isinstance(extra, OneOf):
            allowed = tuple(extra.choices())
            if value not in allowed:
                reasons = dict(extra.unsupported)
                why = f" ({reasons[value]})" if value in reasons else ""
                return f"{key}={fmt(value)} is not supported{why}; supported: {', '.join(allowed)}"
    return None


def _check_value(key: str, raw: Any, annotation: Any, problems: Problems, interpolated: set[str]) -> Any:
    base, extras = _split(annotation)
    alternatives, allow_none = _options(base)
    if raw is INVALID:  # could not be read; reported already
        return INVALID
    if raw is None:
        if allow_none or alternatives == [Any]:
            return None
        problems.add(f"{key}=None must be {_describe(alternatives)}" + _hint(extras))
        return INVALID
    sections = [alt for alt in alternatives if dataclasses.is_dataclass(alt)]
    if sections:
        if isinstance(raw, dict):
            return build_section(sections[0], raw, key, problems, interpolated)
        problems.add(f"{key}={fmt(raw)} must be a section (a mapping of keys)")
        return INVALID
    if any(isinstance(e, AsList) for e in extras) and isinstance(raw, str):
        raw = [raw]
    for alt in alternatives:
        ok, converted = _convert(raw, alt)
        if ok:
            break
    else:
        positive = any(isinstance(e, Positive) for e in extras)
        if positive and alternatives in ([int], [float]):
            tail = " or null" if allow_none else ""
            kind = "a positive integer" if alternatives == [int] else "a positive number"
            problems.add(f"{key}={fmt(raw)} must be {kind}{tail}")
        else:
            problems.add(f"{key}={fmt(raw)} must be {_describe(alternatives)}" + (" or null" if allow_none else ""))
        return INVALID
    if isinstance(converted, tuple):
        return _check_items(key, converted, alternatives, problems)
    if not isinstance(converted, (dict, tuple)):
        problem = _constraint_problem(key, converted, extras, allow_none, shown=raw)
        if problem:
            # A key that repeats another (an interpolation) is reported at its source only.
            if key not in interpolated:
                problems.add(problem)
            return INVALID
    return converted


def _check_items(key: str, value: tuple, alternatives: list[Any], problems: Problems) -> Any:
    """A list whose items must each be one of a registry's names."""
    for alt in alternatives:
        if get_origin(alt) in (list, tuple) and get_args(alt):
            extras = _split(get_args(alt)[0])[1]
            for item in value:
                problem = _first_problem(f"{key}[]", item, tuple(e for e in extras if not isinstance(e, OneOf)), "")
                if problem:
                    problems.add(f"{key}={fmt(value)}: {problem.removeprefix(f'{key}[]=')}")
                    return INVALID
            for extra in extras:
                if isinstance(extra, OneOf):
                    allowed = tuple(extra.choices())
                    unknown = [v for v in value if v not in allowed]
                    if unknown:
                        problems.add(
                            f"{key}={fmt(value)}: {', '.join(map(repr, unknown))} not supported; "
                            f"supported: {', '.join(allowed)}"
                        )
                        return INVALID
    return value


def _hint(extras: tuple) -> str:
    return "".join(f" ({e.note})" for e in extras if isinstance(e, NonNegative) and e.note)


def build_section(cls: type, data: dict, prefix: str, problems: Problems, interpolated: set[str] = frozenset()):
    """An instance of section class `cls` from the mapping `data` found at `prefix`."""
    fields = section_fields(cls)
    values = {}
    for name, annotation in fields.items():
        key = f"{prefix}.{name}" if prefix else name
        if name not in data:
            problems.add(f"{key} is missing from the configuration; restore it (see `--cfg job`)")
            values[name] = INVALID
            continue
        values[name] = _check_value(key, data[name], annotation, problems, interpolated)
    for name in data:
        if name not in fields:
            key = f"{prefix}.{name}" if prefix else str(name)
            near = difflib.get_close_matches(str(name), list(fields), n=1)
            hint = f"did you mean {prefix + '.' if prefix else ''}{near[0]}?" if near else "`--cfg job` lists the keys"
            problems.add(f"{key}: hybrid has no such key and would ignore it; {hint}")
    return cls(**values)


PositiveInt = Annotated[int, Positive()]
OptionalPositiveInt = Annotated[int | None, Positive()]
Paths = str | tuple[str, ...]
