"""ROLL's local code reward (reward/scorers/roll_code.py): pass/fail of a few tiny programs against
their rows' test cases, by the rules of ROLL's code_sandbox_reward_worker.py local mode."""

from __future__ import annotations

import json

import pytest

from reward.scorers import roll_code, roll_code_io

ADD = "```python\ndef add(a, b):\n    return a + b\n```"
PYTEST_ROW = {
    "case_type": "pytest",
    "test_case_function": " ",
    "test_cases": json.dumps(
        [
            {"assert_code": "\n\ndef test_small():\n    assert add(1, 2) == 3\n"},
            {"assert_code": "def test_negative():\n    assert add(-1, -2) == -3\n"},
        ]
    ),
}


def score(response, row, **options):
    return roll_code.compute_score(response, row, **options)["score"]


def test_extract_code():
    two = "```text\nhello\n```\nthen\n```python\ndef f():\n    return 1\n```\n```python\ndef g(): pass\n```"
    assert roll_code.extract_code(two) == "def f():\n    return 1\n"  # the first block with 'def '
    assert roll_code.extract_code("```\nx = 1\n```") == "x = 1\n"
    assert roll_code.extract_code("  def f(): pass  ") == "def f(): pass"  # no fence: the whole text
    assert roll_code.extract_code("```python\ndef f(): pass") == ""  # no block closes
    assert roll_code.extract_code("<think>```python\ndef bad(): 1```</think>\n```\nok = 1```") == "ok = 1"


def test_pytest_row_passes_and_a_failing_case_fails():
    assert score(ADD, PYTEST_ROW) == 1.0
    # the first test case passes (add(1, 2) == 3), the second fails (add(-1, -2) == 0)
    wrong = "```python\ndef add(a, b):\n    return a + b if a > 0 else 0\n```"
    assert score(wrong, PYTEST_ROW) == 0.0


def test_timed_out_program_and_empty_response_score_zero():
    slow = "```python\ndef add(a, b):\n    while True:\n        pass\n```"
    assert score(slow, PYTEST_ROW, timeout_s=0.5) == 0.0
    assert score("", PYTEST_ROW) == 0.0
    # ROLL's rule: a row with no test case passes (here the row as JSON text)
    assert roll_code.compute_score(ADD, json.dumps({**PYTEST_ROW, "test_cases": "[]"})) == {"score": 1.0, "acc": 1.0}


def test_programs_run_as_roll_runs_them():
    # globals start empty, so __name__ is 'builtins' and the main block (which would read stdin) does not run;
    # ROLL's guard has replaced os.getcwd by None, so code that calls it fails
    row = {"case_type": "assert", "test_cases": [{"assert_code": "assert add(2, 2) == 4"}], "test_case_function": ""}
    main_block = "def add(a, b):\n    return a + b\nif __name__ == '__main__':\n    print(add(*input().split()))"
    assert score(main_block, row) == 1.0
    guarded = "import os\ndef add(a, b):\n    os.getcwd()\n    return a + b"
    assert score(guarded, row) == 0.0
    # ROLL counts any BaseException as a failure: leaving with sys.exit(0) does not pass
    assert score("import sys\ndef add(a, b):\n    return a + b\nsys.exit(0)", row) == 0.0


def test_check_based_row():
    row = {
        "case_type": "check_based",
        "test_case_function": "",
        "test_cases": [
            {"assert_code": "def check(f):\n\n    assert f(2) == 4\n    assert f(3) == 9", "entry_point": "square"}
        ],
    }
    assert score("def square(x):\n    return x * x", row) == 1.0
    assert score("def square(x):\n    return 2 * x", row) == 0.0  # f(2) == 4 passes, f(3) == 9 fails


def test_text_row():
    row = {"case_type": "text", "test_case_function": "", "test_cases": ["assert 'Paris' in {response}"]}
    assert score("<think>Lyon?</think>\nIt is Paris.", row) == 1.0
    assert score("It is Lyon.", row) == 0.0


def test_refusals():
    with pytest.raises(ValueError, match="use_local=false asks for ROLL's remote code sandbox"):
        roll_code.compute_score(ADD, PYTEST_ROW, use_local=False, code_url="http://sandbox")
    with pytest.raises(ValueError, match="the ground truth must be the row's test data"):
        score(ADD, '["def add(a, b): return a + b"]')


def test_io_harness_rules_in_process():
    # ROLL's rewrite: top-level imports stay, everything else goes into code()
    assert roll_code_io._stdin_program("import sys\nn = int(input())\nprint(n)") == (
        "import sys\nstdin = sys.stdin\nstdout = sys.stdout\ndef code():\n\tn = int(input())\n\tprint(n)\n"
    )
    matches = roll_code_io._stdout_matches
    assert matches("1 2  \n", "1 2")  # joined and stripped lines
    assert matches("3\n\n4\n", "3\n4")  # empty printed lines dropped
    assert matches("0.3333333333\n", "0.333333")  # floats, numpy's allclose
    assert not matches("01\n", "1")  # integer lines are compared as text
    assert not matches("1\n2\n", "1 2")


def test_io_rows_pass_and_fail():
    # the main block is unwrapped; `stdin` bound at load time reads the case's input (ROLL patches
    # readline on the stdin object of before)
    halves = (
        "```python\nfrom sys import stdin\ndef main():\n    a, b = map(int, stdin.readline().split())\n"
        "    print(a / b)\nif __name__ == '__main__':\n    main()\n```"
    )
    stdin_row = {
        "case_type": "input",
        "test_case_function": "None",
        "test_cases": [{"stdin": "1 3", "expected_stdout": "0.333333"}, {"stdin": "4 2\n", "expected_stdout": "2.0\n"}],
    }
    assert score(halves, stdin_row) == 1.0
    call_row = {
        "case_type": "",
        "test_case_function": "pair",
        "test_cases": [{"stdin": "[2, 7, 11]\n9", "expected_stdout": "[0, 1]"}],
    }
    solution = "class Solution:\n    def pair(self, nums, target):\n        return {}([nums.index(2), nums.index(7)])"
    assert score(solution.format("tuple"), call_row) == 1.0  # a tuple compares as a list
    assert score(solution.format("set"), call_row) == 0.0  # not JSON-serialisable: ROLL fails it
