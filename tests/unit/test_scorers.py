"""Rule-based scorers: GSM8K rows end to end (preprocess -> dataset -> scorer), MATH answer
equivalence, arithmetic, and dispatch by data_source."""

from __future__ import annotations

import json
import runpy
from pathlib import Path

import pytest

from hybrid.config import load_config
from hybrid.data import RLHFDataset
from reward.scorers import arithmetic as arithmetic_scorer
from reward.scorers import default_compute_score, gsm8k, known_data_sources
from reward.scorers import math as math_scorer

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "data_preprocess"

# Rows from the public GSM8K dataset (main config), question and answer text as published.
GSM8K_TRAIN = [
    {
        "question": (
            "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
            "How many clips did Natalia sell altogether in April and May?"
        ),
        "answer": (
            "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
            "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n"
            "#### 72"
        ),
    },
    {
        "question": (
            "Weng earns $12 an hour for babysitting. "
            "Yesterday, she just did 50 minutes of babysitting. "
            "How much did she earn?"
        ),
        "answer": (
            "Weng earns 12/60 = $<<12/60=0.2>>0.2 per minute.\n"
            "Working 50 minutes, she earned 0.2 x 50 = $<<0.2*50=10>>10.\n"
            "#### 10"
        ),
    },
    {
        "question": (
            "Betty is saving money for a new wallet which costs $100. "
            "Betty has only half of the money she needs. "
            "Her parents decided to give her $15 for that purpose, and her grandparents twice as much as her parents. "
            "How much more money does Betty need to buy the wallet?"
        ),
        "answer": (
            "In the beginning, Betty has only 100 / 2 = $<<100/2=50>>50.\n"
            "Betty's grandparents gave her 15 * 2 = $<<15*2=30>>30.\n"
            "This means, Betty needs 100 - 50 - 30 - 15 = $<<100-50-30-15=5>>5 more.\n"
            "#### 5"
        ),
    },
    {
        "question": (
            "James writes a 3-page letter to 2 different friends twice a week.  How many pages does he write a year?"
        ),
        "answer": (
            "He writes each friend 3*2=<<3*2=6>>6 pages a week\n"
            "So he writes 6*2=<<6*2=12>>12 pages every week\n"
            "That means he writes 12*52=<<12*52=624>>624 pages a year\n"
            "#### 624"
        ),
    },
]
GSM8K_TEST = [
    {
        "question": (
            "Janet\u2019s ducks lay 16 eggs per day. "
            "She eats three for breakfast every morning and bakes muffins for her friends every day with four. "
            "She sells the remainder at the farmers' market daily for $2 per fresh duck egg. "
            "How much in dollars does she make every day at the farmers' market?"
        ),
        "answer": (
            "Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.\n"
            "She makes 9 * 2 = $<<9*2=18>>18 every day at the farmer\u2019s market.\n"
            "#### 18"
        ),
    },
]


@pytest.fixture(scope="module")
def gsm8k_script():
    return runpy.run_path(str(EXAMPLES / "gsm8k.py"))


def _write_jsonl(path: Path, rows) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_gsm8k_rows_through_preprocess_dataset_and_scorer(tmp_path, tokenizer, gsm8k_script):
    raw = tmp_path / "raw"
    _write_jsonl(raw / "train.jsonl", GSM8K_TRAIN)
    _write_jsonl(raw / "test.jsonl", GSM8K_TEST)
    paths = gsm8k_script["process_dir"](str(raw), str(tmp_path / "gsm8k"))

    data_cfg = load_config(["data.max_prompt_length=256", "data.return_raw_chat=true"]).data
    dataset = RLHFDataset(paths["train"], tokenizer, data_cfg)
    assert len(dataset) == 4
    truths = [dataset[i]["reward_model"]["ground_truth"] for i in range(4)]
    assert truths == ["72", "10", "5", "624"]
    first = dataset[0]
    assert first["data_source"] == "openai/gsm8k"
    assert first["raw_prompt"][0]["content"] == GSM8K_TRAIN[0]["question"] + " " + gsm8k_script["INSTRUCTION"]
    assert first["extra_info"]["answer"] == GSM8K_TRAIN[0]["answer"]
    assert GSM8K_TRAIN[0]["question"] in tokenizer.decode(first["input_ids"][first["attention_mask"].bool()])

    for i, row in enumerate(GSM8K_TRAIN):
        item = dataset[i]
        truth = item["reward_model"]["ground_truth"]
        ds = item["data_source"]
        # The reference solution itself is a right response in the strict form.
        assert default_compute_score(ds, row["answer"], truth) == 1.0
        wrong = row["answer"].rsplit("####", 1)[0] + f"#### {int(truth) + 1}"
        assert default_compute_score(ds, wrong, truth) == 0.0
        assert default_compute_score(ds, wrong, truth, format_score=0.1) == 0.1
        plain = f"So the answer is {truth}"
        assert default_compute_score(ds, plain, truth) == 0.0  # strict wants "####"
        assert default_compute_score(ds, plain, truth, method="flexible") == 1.0
        # verl's flexible reading keeps the full stop ("72.") and finds it wrong.
        assert default_compute_score(ds, plain + ".", truth, method="flexible", format_score=0.1) == 0.1
        assert default_compute_score(ds, plain + ".", truth, method="flexible", lenient=True) == 1.0
        assert default_compute_score(ds, f"So the answer is {int(truth) + 2}", truth, method="flexible") == 0.0
        assert default_compute_score(ds, "I do not know.", truth, format_score=0.1) == 0.0  # no answer at all

    test_set = RLHFDataset(paths["test"], tokenizer, data_cfg)
    assert test_set[0]["reward_model"]["ground_truth"] == "18"
    assert test_set[0]["extra_info"]["split"] == "test"


# (response, ground truth, verl strict, verl flexible, lenient strict, lenient flexible), with
# format_score=0.1 so "read but wrong" (0.1) and "nothing read" (0) differ. The verl columns
# are what verl's verl/utils/reward_score/gsm8k.py (0.9) returns for the same call.
GSM8K_TABLE = [
    ("... #### 72", "72", 1.0, 1.0, 1.0, 1.0),
    ("#### 18.0", "18", 0.1, 0.1, 1.0, 1.0),  # verl compares text: 18.0 is not 18
    ("#### 3.50", "3.5", 0.1, 0.1, 1.0, 1.0),
    ("####12", "12", 0.0, 1.0, 1.0, 1.0),  # verl's strict needs "#### " with the space
    ("####  12", "12", 0.0, 1.0, 1.0, 1.0),
    ("#### 18.", "18", 0.1, 0.1, 1.0, 1.0),
    ("#### 1,234", "1234", 1.0, 0.1, 1.0, 1.0),  # strict drops commas, flexible keeps them
    ("it costs 1,000", "1000", 0.0, 0.1, 0.0, 1.0),
    ("#### $18", "18", 0.0, 1.0, 1.0, 1.0),  # "$" right after "#### ": verl's strict reads nothing
    ("#### 18$", "18", 1.0, 1.0, 1.0, 1.0),
    ("it costs $1,000.", "1000", 0.0, 0.1, 0.0, 1.0),
    ("#### -3", "-3", 1.0, 1.0, 1.0, 1.0),
    ("the change is -3", "-3", 0.0, 1.0, 0.0, 1.0),
    ("#### -3", "3", 0.1, 0.1, 0.1, 0.1),
    ("#### 5 then #### 7", "7", 1.0, 1.0, 1.0, 1.0),  # the last one counts
    ("#### 5 then #### 7", "5", 0.1, 0.1, 0.1, 0.1),
    ("#### 7 and then I said 5", "7", 1.0, 0.1, 1.0, 0.1),
    ("So the answer is 18.", "18", 0.0, 0.1, 0.0, 1.0),  # verl's flexible reads "18."
    ("The end.", "18", 0.0, 0.1, 0.0, 0.0),  # verl compares the lone "." (wrong)
    ("Hello, world", "18", 0.0, 0.1, 0.0, 0.0),  # ... and a lone ","
    ("no number at all", "18", 0.0, 0.0, 0.0, 0.0),
    ("#### 18" + "x" * 300, "18", 0.0, 0.0, 0.0, 0.0),  # only the last 300 characters are read
    ("x" * 400 + "#### 18", "18", 1.0, 1.0, 1.0, 1.0),
]


@pytest.mark.parametrize("response,truth,strict,flexible,lenient_strict,lenient_flexible", GSM8K_TABLE)
def test_gsm8k_scores_match_verl_and_lenient_option(
    response, truth, strict, flexible, lenient_strict, lenient_flexible
):
    def score(**kw):
        return gsm8k.compute_score(response, truth, format_score=0.1, **kw)

    assert score() == strict
    assert score(method="flexible") == flexible
    assert score(lenient=True) == lenient_strict
    assert score(method="flexible", lenient=True) == lenient_flexible
    # The same through the data_source dispatch, as the reward managers call it.
    assert default_compute_score("openai/gsm8k", response, truth, format_score=0.1) == strict
    assert default_compute_score("openai/gsm8k", response, truth, format_score=0.1, lenient=True) == lenient_strict


def test_gsm8k_score_arguments():
    assert gsm8k.compute_score("#### 72", "72", score=2.0) == 2.0
    assert gsm8k.compute_score("#### 72", 72) == 1.0  # a non-string ground truth compares as its str()
    with pytest.raises(ValueError, match="strict.*flexible"):
        gsm8k.compute_score("#### 1", "1", method="loose")


def test_default_scorer_kwargs_go_to_the_scorers_that_take_them():
    # A mixed data set: gsm8k's options must not break the math and arithmetic rows.
    assert default_compute_score("lighteval/MATH", "\\boxed{3}", "3", lenient=True, method="flexible") == 1.0
    assert default_compute_score("arithmetic", "1 + 2 = 3", "3", lenient=True) == 1.0
    assert default_compute_score("openai/gsm8k", "#### 18.0", "18", lenient=True) == 1.0
    with pytest.raises(
        TypeError, match=r"reward_model.reward_kwargs: no default scorer takes 'lenent'.*gsm8k: .*lenient"
    ):
        default_compute_score("openai/gsm8k", "#### 18", "18", lenent=True)


def test_gsm8k_preprocess_rejects_rows_without_final_answer(tmp_path, gsm8k_script):
    bad = _write_jsonl(tmp_path / "train.jsonl", [{"question": "q", "answer": "no final line"}])
    with pytest.raises(ValueError, match=r"train.jsonl row 0: .*####"):
        gsm8k_script["process_gsm8k"](str(bad), str(tmp_path / "out.parquet"), "train")


EQUIVALENT = [
    ("0.5", "\\frac{1}{2}"),
    ("\\dfrac{1}{2}", "\\frac12"),
    ("1/2", "\\frac{1}{2}"),
    ("\\tfrac{3}{4}", "0.75"),
    ("\\left( 1, 2 \\right)", "(1,2)"),
    ("10\\text{ cm}", "10"),
    ("30^\\circ", "30"),
    ("50\\%", "50"),
    ("x = 5", "5"),
    ("5.", "5"),
    ("\\$1,000", "1000"),
    ("-\\frac{3}{4}", "-0.75"),
    ("\\frac{\\sqrt{2}}{2}", "\\sqrt{2}/2"),
    ("2\\sqrt3", "2\\sqrt{3}"),
    (".5", "\\frac{1}{2}"),
    ("\\frac{\\pi}{2}", "\\pi/2"),
]
NOT_EQUIVALENT = [
    ("0.33", "\\frac{1}{3}"),
    ("2", "3"),
    ("(1,2)", "(2,1)"),
    ("\\sqrt{2}", "2"),
    ("x+1", "x+2"),
    ("\\frac{1}{2}", "\\frac{2}{1}"),
]


@pytest.mark.parametrize("answer,reference", EQUIVALENT)
def test_math_equivalent_forms_score_the_same(answer, reference):
    assert math_scorer.compute_score(f"so the answer is $\\boxed{{{answer}}}$.", reference) == 1.0
    assert math_scorer.compute_score(f"\\boxed{{{reference}}}", answer) == 1.0


@pytest.mark.parametrize("answer,reference", NOT_EQUIVALENT)
def test_math_different_answers_score_0(answer, reference):
    assert math_scorer.compute_score(f"\\boxed{{{answer}}}", reference) == 0.0


def test_math_boxed_extraction():
    text = "First \\boxed{1}, then finally \\boxed{\\frac{1}{\\sqrt{4}}} done"
    assert math_scorer.last_boxed_only_string(text) == "\\boxed{\\frac{1}{\\sqrt{4}}}"
    assert math_scorer.compute_score(text, "0.5") == 1.0
    assert math_scorer.compute_score("the answer is 0.5", "0.5") == 0.0  # no box, no score
    assert math_scorer.compute_score("\\boxed{\\frac{1}{2}", "0.5") == 0.0  # unbalanced braces
    assert math_scorer.extract_boxed_answer("$\\boxed 7$") == "7"
    assert math_scorer.compute_score("\\fbox{12}", "\\boxed{12}") == 1.0


def test_math_preprocess_takes_the_last_boxed_answer(tmp_path):
    script = runpy.run_path(str(EXAMPLES / "math_dataset.py"))
    rows = [
        {
            "problem": "What is $\\frac{1}{2} + \\frac{1}{4}$?",
            "solution": "We have $\\frac{1}{2} = \\frac{2}{4}$, so the sum is $\\boxed{\\frac{3}{4}}$.",
            "level": "Level 1",
            "type": "Prealgebra",
        }
    ]
    src = _write_jsonl(tmp_path / "train.jsonl", rows)
    out = tmp_path / "train.parquet"
    assert script["process_math"](str(src), str(out), "train") == 1
    import pyarrow.parquet as pq

    row = pq.read_table(out).to_pylist()[0]
    assert row["reward_model"]["ground_truth"] == "\\frac{3}{4}"
    assert row["prompt"][0]["content"].endswith("output the final answer within \\boxed{}.")
    assert row["extra_info"] == {"split": "train", "index": 0, "level": "Level 1", "type": "Prealgebra"}
    assert default_compute_score(row["data_source"], "... \\boxed{0.75}", row["reward_model"]["ground_truth"]) == 1.0


def test_arithmetic_last_integer():
    cases = {
        "3 + 5 = 8": 8,
        "5-3=2": 2,
        "8 - 10 = -2.": -2,
        "The answer is 1,234 apples": 1234,
        "8.0<|im_end|>": 8,
        "x = -7<|im_end|>": -7,
    }
    for text, value in cases.items():
        assert arithmetic_scorer.extract_last_integer(text) == value, text
        assert arithmetic_scorer.compute_score(text, str(value)) == 1.0
    assert arithmetic_scorer.compute_score("3 + 5 = 8", "9") == 0.0
    assert arithmetic_scorer.compute_score("2.5", "2") == 0.0
    assert arithmetic_scorer.compute_score("no numbers here", "0") == 0.0
    assert arithmetic_scorer.compute_score("8 is the answer to 3 + 5", "8") == 0.0  # last number counts


def test_default_compute_score_dispatch_and_unknown_source():
    assert default_compute_score("gsm8k", "#### 3", "3") == 1.0
    assert default_compute_score("HuggingFaceH4/MATH-500", "\\boxed{3}", "3") == 1.0
    assert default_compute_score("lighteval/MATH", "\\boxed{3}", "3", extra_info={"index": 1}) == 1.0
    assert default_compute_score("arithmetic", "1 + 2 = 3", "3") == 1.0
    assert {"openai/gsm8k", "DigitalLearningGmbH/MATH-lighteval", "math", "arithmetic"} <= set(known_data_sources())
    with pytest.raises(ValueError, match=r"no default scorer for data_source 'my/data'.*openai/gsm8k.*arithmetic"):
        default_compute_score("my/data", "x", "y")
