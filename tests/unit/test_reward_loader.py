"""custom_reward_function loading: every bad file or function fails at load time, naming
the path and the function; load_reward_manager builds the configured manager."""

from __future__ import annotations

import pickle
import textwrap

import pytest
from omegaconf import OmegaConf

from reward.loader import CustomRewardFunction, get_custom_reward_fn, load_reward_manager
from reward.manager import (
    BatchRewardManager,
    DAPORewardManager,
    NaiveRewardManager,
    PrimeRewardManager,
    get_reward_manager_cls,
)
from reward.scorers import default_compute_score


def _config(path=None, name="compute_score", manager="naive", fn_kwargs=None, manager_kwargs=None):
    return OmegaConf.create(
        {
            "data": {"reward_fn_key": "data_source", "domain_scorers": {}, "domain_scorer_kwargs": {}},
            "reward_model": {
                "reward_manager": manager,
                "sandbox_fusion": None,
                "reward_kwargs": manager_kwargs
                or {
                    "timeout_s": 10,
                    "num_processes": 2,
                    "overlong_buffer": {"enable": False, "len": 16, "penalty_factor": 1.0, "log": False},
                    "max_resp_len": 48,
                },
            },
            "custom_reward_function": {
                "path": None if path is None else str(path),
                "name": name,
                "reward_kwargs": fn_kwargs or {},
            },
        }
    )


def _write(tmp_path, body, name="my_reward.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


GOOD = """
    def compute_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):
        return float(solution_str.strip() == ground_truth) + bonus

    def batch_score(data_sources, solution_strs, ground_truths, extra_infos):
        return [float(s == g) for s, g in zip(solution_strs, ground_truths)]

    THRESHOLD = 3
"""


def test_no_path_means_no_custom_function():
    assert get_custom_reward_fn(_config()) is None


def test_loads_and_binds_reward_kwargs(tmp_path):
    path = _write(tmp_path, GOOD)
    fn = get_custom_reward_fn(_config(path, fn_kwargs={"bonus": 0.5}))
    assert fn(data_source="x", solution_str="7", ground_truth="7", extra_info=None) == 1.5
    assert fn.fn.keywords == {"bonus": 0.5}  # functools.partial
    assert "compute_score in" in fn.describe() and str(path) in fn.describe()
    # It survives pickling (process pools, Ray) by loading the file again.
    clone = pickle.loads(pickle.dumps(fn))
    assert clone(data_source="x", solution_str="1", ground_truth="7") == 0.5


def test_missing_file(tmp_path):
    with pytest.raises(
        FileNotFoundError, match=r"custom_reward_function.path: reward function file '.*nowhere.py' not found"
    ):
        get_custom_reward_fn(_config(tmp_path / "nowhere.py"))


def test_missing_function_lists_what_is_there(tmp_path):
    path = _write(tmp_path, GOOD)
    with pytest.raises(
        AttributeError,
        match=r"reward function 'compute_scores' not found in .*my_reward.py; "
        r"functions defined there: \['batch_score', 'compute_score'\]",
    ):
        get_custom_reward_fn(_config(path, name="compute_scores"))


def test_not_callable(tmp_path):
    path = _write(tmp_path, GOOD)
    with pytest.raises(TypeError, match=r"'THRESHOLD' in .*my_reward.py is a int, not a function"):
        get_custom_reward_fn(_config(path, name="THRESHOLD"))


def test_signature_that_cannot_take_the_reward_arguments(tmp_path):
    path = _write(tmp_path, "def compute_score(solution_str, ground_truth):\n    return 1.0\n")
    with pytest.raises(
        TypeError,
        match=r"reward function compute_score in .*my_reward.py cannot be called as "
        r"f\(data_source, solution_str, ground_truth, extra_info\)",
    ):
        get_custom_reward_fn(_config(path))
    # A per-sample function where the batch manager wants lists, and the other way round.
    good = _write(tmp_path, GOOD, name="good.py")
    with pytest.raises(TypeError, match="compute_score in .*good.py cannot be called as f\\(data_sources"):
        get_custom_reward_fn(_config(good, manager="batch"))
    assert get_custom_reward_fn(_config(good, name="batch_score", manager="batch")) is not None
    # A reward_kwargs key the function does not take.
    with pytest.raises(
        TypeError, match="compute_score in .*good.py cannot be called.*unexpected keyword argument 'bonnus'"
    ):
        get_custom_reward_fn(_config(good, fn_kwargs={"bonnus": 1}))


def test_file_that_fails_to_import(tmp_path):
    path = _write(tmp_path, "import not_a_module_anywhere\n")
    with pytest.raises(ImportError, match=r"importing .*my_reward.py failed: ModuleNotFoundError"):
        get_custom_reward_fn(_config(path))


def test_manager_names():
    assert get_reward_manager_cls("prime") is PrimeRewardManager
    with pytest.raises(
        ValueError, match="unknown reward_model.reward_manager 'fancy'; known: naive, prime, batch, dapo"
    ):
        get_reward_manager_cls("fancy")


def test_load_reward_manager_builds_each_kind(tokenizer, tmp_path):
    naive = load_reward_manager(_config(), tokenizer, num_examine=0)
    assert isinstance(naive, NaiveRewardManager) and naive.compute_score is default_compute_score
    assert naive.score_kwargs == {}  # the prime/dapo keys of the shared config are not passed on

    prime = load_reward_manager(_config(manager="prime"), tokenizer, num_examine=0, timeout_s=3)
    assert isinstance(prime, PrimeRewardManager) and prime.timeout_s == 3 and prime.num_processes == 2
    prime.close()

    dapo = load_reward_manager(
        _config(
            manager="dapo",
            manager_kwargs={"overlong_buffer": {"enable": True, "len": 4, "penalty_factor": 0.5}, "max_resp_len": 10},
        ),
        tokenizer,
        num_examine=0,
    )
    assert isinstance(dapo, DAPORewardManager) and dapo.overlong_enable and dapo.overlong_len == 4

    path = _write(tmp_path, GOOD)
    batch = load_reward_manager(_config(path, name="batch_score", manager="batch"), tokenizer, num_examine=0)
    assert isinstance(batch, BatchRewardManager) and isinstance(batch.compute_score, CustomRewardFunction)

    # Manager kwargs no manager knows go to the function, which must take them.
    with pytest.raises(TypeError, match="unexpected keyword argument 'temperature'"):
        load_reward_manager(_config(path, manager_kwargs={"temperature": 2}), tokenizer, num_examine=0)
    scaled = load_reward_manager(_config(path, manager_kwargs={"bonus": 2}), tokenizer, num_examine=0)
    assert scaled.score_kwargs == {"bonus": 2}


def test_bad_manager_settings_fail_at_load(tokenizer):
    with pytest.raises(ValueError, match="overlong_buffer.len=64 must be in \\(0, max_resp_len=48\\]"):
        load_reward_manager(
            _config(
                manager="dapo", manager_kwargs={"overlong_buffer": {"enable": True, "len": 64}, "max_resp_len": 48}
            ),
            tokenizer,
            0,
        )
    with pytest.raises(TypeError, match="cannot be pickled"):
        PrimeRewardManager(tokenizer, 0, compute_score=lambda **kw: 1.0)
    config = _config()
    config.reward_model.sandbox_fusion = {"url": "http://localhost:8080"}
    with pytest.raises(ValueError, match="sandbox_fusion"):
        load_reward_manager(config, tokenizer, 0)


@pytest.mark.parametrize("typed", [False, True], ids=["dictconfig", "frozen"])
def test_reward_kwargs_reach_the_gsm8k_scorer_from_the_command_line(tokenizer, typed):
    """`reward_model.reward_kwargs.lenient=true` switches gsm8k to the lenient reading; the
    sections may be DictConfig or the frozen dataclasses (attribute access only)."""
    from hybrid.config import build_config, load_config
    from tests.unit.test_reward_manager import make_batch

    responses, truths = ["#### 18.0", "#### 18", "So it is 18."], ["18", "18", "18"]
    data, lengths = make_batch(tokenizer, responses, truths, sources=["openai/gsm8k"] * 3)
    load = build_config if typed else load_config
    for overrides, expected in (
        ([], [0.0, 1.0, 0.0]),  # verl's strict reading
        (["reward_model.reward_kwargs.lenient=true"], [1.0, 1.0, 0.0]),
        (["reward_model.reward_kwargs.lenient=true", "reward_model.reward_kwargs.method=flexible"], [1.0, 1.0, 1.0]),
    ):
        manager = load_reward_manager(load(overrides), tokenizer, num_examine=0)
        scores = manager(data)
        assert [scores[i, n - 1].item() for i, n in enumerate(lengths)] == expected, overrides


def test_reward_kwargs_no_default_scorer_takes_fail_at_load(tokenizer):
    with pytest.raises(
        TypeError, match=r"reward_model.reward_kwargs: no default scorer takes 'lenint'.*gsm8k: .*lenient"
    ):
        load_reward_manager(_config(manager_kwargs={"timeout_s": 10, "lenint": True}), tokenizer, num_examine=0)
    # The batch manager's default scores through the same scorers.
    with pytest.raises(TypeError, match=r"no default scorer takes 'lenint'"):
        load_reward_manager(_config(manager="batch", manager_kwargs={"lenint": True}), tokenizer, num_examine=0)


def test_empty_custom_function_name_is_named(tmp_path):
    path = _write(tmp_path, GOOD)
    with pytest.raises(ValueError, match=r"custom_reward_function.name is None; set it to the name of the function"):
        get_custom_reward_fn(_config(path, name=None))
