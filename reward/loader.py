"""Loading the user's reward function and building the configured reward manager.

`custom_reward_function.path/name` name a Python file and a function in it; the file is
loaded and the function's signature checked when the trainer starts, so a wrong path, a
missing or misspelled function or a signature that cannot take the reward arguments
fails before any rollout, with the path and the function in the message.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .config import fold_overlong_spellings
from .domain_scorers import DomainScorers
from .manager import get_reward_manager_cls
from .scorers import check_score_kwargs, default_compute_score
from .user_code import describe_callable, load_user_file

# How a reward manager calls a per-sample function (keywords, as verl does) ...
_SAMPLE_ARGS = {"data_source": "", "solution_str": "", "ground_truth": "", "extra_info": None}
# ... and how the batch manager calls one (lists).
_BATCH_ARGS = {"data_sources": [], "solution_strs": [], "ground_truths": [], "extra_infos": []}


def _plain(value):
    """Mappings and lists of a config section (DictConfig/ListConfig or frozen-dataclass
    fields) as plain dicts and lists, nested ones too: reward functions get ordinary
    Python values, and the prime manager can pickle them into its worker processes."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return [_plain(v) for v in value]
    return value


def _load_module(path: str):
    return load_user_file(path, "custom_reward_function.path", "reward function", "custom_reward")


class CustomRewardFunction:
    """`name` from the file at `path`, with `reward_kwargs` bound (functools.partial).

    It pickles as (path, name, kwargs) and loads the file again on the other side, so a
    process pool or a Ray actor can call it even though the file is not an importable
    module there.
    """

    def __init__(self, path: str, name: str, reward_kwargs: dict | None = None):
        self.path = path
        self.name = name
        self.reward_kwargs = dict(reward_kwargs or {})
        module, self.resolved_path = _load_module(path)
        if not hasattr(module, name):
            defined = sorted(
                k for k, v in vars(module).items() if callable(v) and getattr(v, "__module__", None) == module.__name__
            )
            raise AttributeError(
                f"custom_reward_function.name: reward function {name!r} not found in {self.resolved_path}; "
                f"functions defined there: {defined or 'none'}"
            )
        raw = getattr(module, name)
        if not callable(raw):
            raise TypeError(
                f"custom_reward_function.name: {name!r} in {self.resolved_path} is a {type(raw).__name__}, "
                f"not a function"
            )
        self.fn = functools.partial(raw, **self.reward_kwargs)

    def describe(self) -> str:
        return f"{self.name} in {self.resolved_path}"

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)

    def __reduce__(self):
        return (CustomRewardFunction, (self.resolved_path, self.name, self.reward_kwargs))

    def __repr__(self) -> str:
        return f"CustomRewardFunction({self.describe()!r}, reward_kwargs={self.reward_kwargs})"


def check_reward_signature(fn: Callable, batch: bool = False, extra_kwargs: dict | None = None) -> None:
    """Raise TypeError, naming the function, when `fn` cannot be called the way a reward
    manager calls it (per sample, or with lists for the batch manager)."""
    call = dict(_BATCH_ARGS if batch else _SAMPLE_ARGS)
    call.update(extra_kwargs or {})
    # Check the underlying function with the bound arguments added: inspect.signature of
    # a partial with a bad keyword raises before it can say which keyword is wrong.
    target = fn.fn if isinstance(fn, CustomRewardFunction) else fn
    bound_args: tuple = ()
    bound_kwargs: dict = {}
    while isinstance(target, functools.partial):
        bound_args = target.args + bound_args
        bound_kwargs = {**target.keywords, **bound_kwargs}
        target = target.func
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError) as e:
        raise TypeError(f"reward function {describe_callable(fn)} has no inspectable signature: {e}") from e
    try:
        signature.bind(*bound_args, **{**bound_kwargs, **call})
    except TypeError as e:
        shown = list(call) + [f"{k}=..." for k in bound_kwargs if k not in call]
        raise TypeError(
            f"reward function {describe_callable(fn)} cannot be called as f({', '.join(shown)}): {e}. "
            f"Its signature is {signature}."
        ) from e


def get_custom_reward_fn(config) -> CustomRewardFunction | None:
    """The function named by `custom_reward_function.path/name`, or None when no path is set."""
    section = config.custom_reward_function
    if not section.path:
        return None
    if not section.name:
        raise ValueError(
            f"custom_reward_function.name is {section.name!r}; set it to the name of the function in "
            f"{section.path} (verl's default: compute_score)"
        )
    fn = CustomRewardFunction(section.path, section.name, _plain(section.reward_kwargs or {}))
    check_reward_signature(fn, batch=(config.reward_model.reward_manager == "batch"))
    print(f"using custom reward function {fn.describe()}")
    return fn


def load_reward_manager(config, tokenizer, num_examine: int, **reward_kwargs: Any):
    """The manager named by `reward_model.reward_manager`, scoring with the custom reward
    function when one is set and with `default_compute_score` otherwise.

    Manager arguments come from `reward_model.reward_kwargs`, overridden by `reward_kwargs`;
    the keys no manager uses go to the scoring function (checked here against its
    signature, or against the default scorers' options).
    """
    reward_model = config.reward_model
    name = reward_model.reward_manager
    manager_cls = get_reward_manager_cls(name)
    if reward_model.sandbox_fusion:
        raise ValueError(
            "reward_model.sandbox_fusion is set, but hybrid has no sandbox code execution; "
            "set it to null and score code with a custom_reward_function"
        )
    # verl's DAPO scripts spell the overlong buffer overlong_buffer_cfg: the same setting.
    kwargs = fold_overlong_spellings(_plain(reward_model.reward_kwargs or {}))
    kwargs.update({k: _plain(v) for k, v in reward_kwargs.items()})
    passed_on = {k: v for k, v in kwargs.items() if k not in manager_cls.manager_kwargs()}
    compute_score = get_custom_reward_fn(config)
    domain_scorers = dict(config.data.domain_scorers or {})
    if domain_scorers:
        if compute_score is not None or name == "batch":
            raise ValueError(
                "data.domain_scorers scores each row by its domain's scorer, one response at a time: unset "
                "custom_reward_function.path and use a per-sample reward_model.reward_manager (naive, dapo, prime)"
            )
        compute_score = DomainScorers(domain_scorers, _plain(config.data.domain_scorer_kwargs or {}))
        compute_score.check_kwargs(passed_on)
    elif compute_score is not None:
        if passed_on:
            check_reward_signature(compute_score, batch=(name == "batch"), extra_kwargs=passed_on)
    else:
        # Both the per-sample and the batch default pass these on to the scorers.
        check_score_kwargs(passed_on)
        if name != "batch":
            compute_score = default_compute_score
    return manager_cls(
        tokenizer=tokenizer,
        num_examine=num_examine,
        compute_score=compute_score,
        reward_fn_key=config.data.reward_fn_key,
        **kwargs,
    )
