"""ROLL's code reward (CodeSandboxRewardWorker, local mode) as a scorer: 1 when the response's
code passes every test case of its row, else 0.

The rules are ROLL's local path (code_sandbox_reward_worker.py `cal_local_test`, with
roll/utils/local_code/*), read from its code; the programs run in the limited child
process of hybrid's Python tool (reward/environments/python_tool.py).

- The ground truth is the row's test data, ROLL's columns `case_type`, `test_cases`
  (a list, or its JSON text) and `test_case_function`, as a dict or its JSON text.
- An empty response scores 0. The text after the last `<|begin_of_solution|>` and after
  the last `</think>` is read. Unless `case_type` is `text`, the code is the first fenced
  block that contains `def ` (else the first fenced block; the whole text when it has no
  ``` at all; nothing when no block closes).
- `assert` and `pytest`: for each test case, the program `BASE_IMPORTS + code +
  assert_code` runs (plus a call of every `def test_...` line's function, in order, when
  the test has any), its globals a fresh dict (so `__name__` is `builtins`, and an
  `if __name__ == "__main__":` block does not run), with ROLL's guard (os.remove,
  subprocess.Popen, exit... replaced by None; stdin raising on read). It passes when
  it raises nothing within `timeout_s`. All test cases pass: 1, and a row with no test
  case scores 1, as in ROLL.
- `check_based`: for each line after the first of the test's `assert_code` (blank lines
  dropped), `import_prefix + BASE_IMPORTS + code`, the first line, that line and
  `check(<entry_point>)` run as a script (`__main__`); exit status 0 passes.
- `text`: each test's `assert_code`, `{response}` replaced by the response in triple
  quotes, is executed as ROLL's worker executes it (its module's json, re, time,
  traceback and uuid at hand, not asyncio; `response` among the locals); no exception passes.
- Any other `case_type`: stdin/stdout or call-based tests (`test_cases` with `stdin` and
  `expected_stdout`, `test_case_function` the function to call, or empty/"None" for a
  program reading stdin), run through ROLL's LiveCodeBench harness, all cases in one
  child process with ROLL's limit of `min(timeout_s * n + 1, 360)` s (roll_code_io.py).

`timeout_s` is ROLL's time limit of one program, 20 s. Where hybrid's child differs from
ROLL's process, a program can pass in one and fail in the other: the child has a memory
limit (`memory_mb`, default 4096; ROLL sets none), a 1 MiB file-size limit, no network,
and `text` tests run in it under `timeout_s` (ROLL runs them in the worker without one).
A malformed row (a test case without `assert_code`, `stdin` or `expected_stdout`) raises
here, where ROLL's worker scores it 0.

`use_local` must be true: ROLL's remote sandbox service (`code_url`) is not reachable.
"""

from __future__ import annotations

import json
import re
import secrets
from typing import Any

from reward.environments.python_tool import PythonRun, execute_python

from . import roll_code_io

# The imports ROLL puts before every program (roll/utils/local_code/execute_utils.py).
BASE_IMPORTS = (
    "from string import *\nfrom re import *\nfrom datetime import *\nfrom collections import *\n"
    "from heapq import *\nfrom bisect import *\nfrom copy import *\nfrom math import *\nfrom random import *\n"
    "from statistics import *\nfrom itertools import *\nfrom functools import *\nfrom operator import *\n"
    "from io import *\nfrom sys import *\nfrom json import *\nfrom builtins import *\nfrom typing import *\n"
    "import string\nimport re\nimport datetime\nimport collections\nimport heapq\nimport bisect\nimport copy\n"
    "import math\nimport random\nimport statistics\nimport itertools\nimport functools\nimport operator\n"
    "import io\nimport sys\nimport json\nfrom typing import List, Dict, Any, Optional, Tuple\n"
    "from math import inf\nsys.setrecursionlimit(6*10**5)\n"
)
DEFAULT_TIMEOUT_S = 20.0
# ROLL's whole-run limit of the stdin/stdout harness (evaluator.py codegen_check_correctness).
IO_MAX_TIMEOUT_S = 360.0

# Runs an assert/pytest program the way ROLL's codeexecute_check_correctness does: what its
# reliability guard disables is disabled, stdin raises on read, globals start empty.
_GUARDED = """
import builtins, faulthandler, io, os, shutil, subprocess, sys
class _NoInput(io.StringIO):
    def read(self, *args, **kwargs):
        raise OSError
    def readline(self, *args, **kwargs):
        raise OSError
    def readlines(self, *args, **kwargs):
        raise OSError
    def readable(self, *args, **kwargs):
        return False
faulthandler.disable()
builtins.exit = builtins.quit = builtins.help = None
os.environ["OMP_NUM_THREADS"] = "1"
for _name in ("kill system putenv remove removedirs rmdir fchdir setuid fork forkpty killpg rename renames "
              "truncate replace unlink fchmod fchown chmod chown chroot lchflags lchmod lchown getcwd chdir").split():
    setattr(os, _name, None)
shutil.rmtree = shutil.move = shutil.chown = None
subprocess.Popen = None
for _name in ("ipdb", "joblib", "resource", "psutil", "tkinter"):
    sys.modules[_name] = None
sys.stdin = _NoInput()
try:
    exec(compile(PROGRAM, "<solution>", "exec"), {})
except BaseException:
    # ROLL records any BaseException as a failure, SystemExit(0) included.
    raise SystemExit(1)
"""
# Runs a text test as ROLL's run_text_tests does: exec() in the worker's module with the
# function's locals. (Not asyncio: the child's network block leaves ssl, which it imports, unusable.)
_TEXT = """
import json, re, time, traceback, uuid
from typing import Any, Dict, List, Optional, Tuple, Union
_globals = {"__name__": "roll.pipeline.rlvr.rewards.code_sandbox_reward_worker", "json": json, "re": re,
            "time": time, "traceback": traceback, "uuid": uuid, "Any": Any, "Dict": Dict, "List": List,
            "Optional": Optional, "Tuple": Tuple, "Union": Union}
exec(compile(PROGRAM, "<text test>", "exec"), _globals, dict(LOCALS))
"""
_FENCED = re.compile(r"```([\w\+\#\-\.]*)\s*\n*(.*?)```", re.DOTALL)
_FENCED_BARE = re.compile(r"```(.*?)```", re.DOTALL)


def final_text(response: str) -> str:
    """The response after the last `<|begin_of_solution|>` and the last `</think>`, stripped."""
    if "<|begin_of_solution|>" in response:
        response = response.split("<|begin_of_solution|>")[-1].strip()
    if "</think>" in response:
        response = response.split("</think>")[-1].strip()
    return response


def extract_code(response: str) -> str:
    """The code of a response, as ROLL's extract_code_generation reads it."""
    text = final_text(response)
    if "```" not in text:
        return text.strip()
    blocks = [code for _, code in _FENCED.findall(text)] or _FENCED_BARE.findall(text)
    if not blocks:
        return ""
    with_def = [block for block in blocks if "def " in block]
    return (with_def or blocks)[0]


def _test_function_calls(assert_code: str) -> str:
    names = [
        line.strip().split("(")[0].split("def ")[1]
        for line in assert_code.strip().split("\n")
        if line.strip().startswith("def test_")
    ]
    return "\n\n# Test runner\n" + "".join(f"{name}()\n" for name in names)


def _passes(run: PythonRun) -> bool:
    return run.returncode == 0


def _run_wrapped(wrapper: str, timeout_s: float, memory_mb: int, **values: Any) -> PythonRun:
    assignments = "".join(f"{name} = {value!r}\n" for name, value in values.items())
    return execute_python(assignments + wrapper, timeout_s=timeout_s, memory_mb=memory_mb)


def _assert_tests(code: str, test_cases: list, timeout_s: float, memory_mb: int) -> bool:
    for case in test_cases:
        assert_code = case["assert_code"]
        program = f"{BASE_IMPORTS}\n{code}\n{assert_code}"
        if "def test_" in assert_code:
            program += _test_function_calls(assert_code)
        if not _passes(_run_wrapped(_GUARDED, timeout_s, memory_mb, PROGRAM=program)):
            return False
    return True


def _check_based_tests(code: str, test_cases: list, timeout_s: float, memory_mb: int) -> bool:
    if not test_cases:
        return True
    case = test_cases[0]
    lines = [line for line in case["assert_code"].split("\n") if line != ""]
    solution = case.get("import_prefix", "") + BASE_IMPORTS + code
    entry_point = case.get("entry_point", "candidate")
    checks = [lines[0] + "\n" + line for line in lines[1:]] if len(lines) > 1 else [lines[0]]
    for check in checks:
        program = f"{solution}\n{check}\ncheck({entry_point})"
        if not _passes(execute_python(program, timeout_s=timeout_s, memory_mb=memory_mb)):
            return False
    return True


def _text_tests(response: str, test_cases: list, timeout_s: float, memory_mb: int) -> bool:
    for case in test_cases:
        assert_code = case["assert_code"] if "assert_code" in case else case
        program = assert_code.replace("{response}", f"'''{response}'''")
        run = _run_wrapped(_TEXT, timeout_s, memory_mb, PROGRAM=program, LOCALS={"response": response})
        if not _passes(run):
            return False
    return True


def _io_tests(code: str, test_cases: list, fn_name: Any, timeout_s: float, memory_mb: int) -> bool:
    inputs = [case["stdin"] for case in test_cases]
    outputs = [case["expected_stdout"] for case in test_cases]
    fn_name = "" if fn_name == "None" else fn_name
    marker = f"roll_code_io verdict {secrets.token_hex(8)}: "
    source = roll_code_io.program(BASE_IMPORTS, code, inputs, outputs, fn_name, marker)
    limit = min(timeout_s * len(inputs) + 1, IO_MAX_TIMEOUT_S)
    # The verdict line counts even when the run then hangs (ROLL keeps a result written before the kill).
    run = execute_python(source, timeout_s=limit, memory_mb=memory_mb)
    verdicts = [line[len(marker) :] for line in run.stdout.splitlines() if line.startswith(marker)]
    return verdicts[-1:] == ["True"]


def _row(ground_truth: Any) -> tuple[str, list, Any]:
    row = json.loads(ground_truth) if isinstance(ground_truth, str) else ground_truth
    if not isinstance(row, dict) or "case_type" not in row or "test_cases" not in row:
        raise ValueError(
            "roll_code: the ground truth must be the row's test data, a dict (or its JSON) with ROLL's columns "
            f"case_type, test_cases and test_case_function; got {type(row).__name__}"
        )
    test_cases = row["test_cases"]
    if isinstance(test_cases, str):
        test_cases = json.loads(test_cases)
    return row["case_type"], list(test_cases), row.get("test_case_function")


def compute_score(
    solution_str: str,
    ground_truth: Any,
    use_local: bool = True,
    code_url: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    memory_mb: int = 4096,
) -> dict:
    """ROLL's local code reward of one response (see the module docstring); `code_url` is read
    only by ROLL's remote mode, which is refused."""
    if not use_local:
        raise ValueError(
            "roll_code: rewards.<domain>.use_local=false asks for ROLL's remote code sandbox (code_url), which "
            "hybrid cannot reach; set use_local: true to run the tests in local processes"
        )
    case_type, test_cases, fn_name = _row(ground_truth)
    if solution_str == "":
        passed = False
    elif case_type == "text":
        passed = _text_tests(final_text(solution_str), test_cases, timeout_s, memory_mb)
    elif case_type == "check_based":
        passed = _check_based_tests(extract_code(solution_str), test_cases, timeout_s, memory_mb)
    elif case_type in ("assert", "pytest"):
        passed = _assert_tests(extract_code(solution_str), test_cases, timeout_s, memory_mb)
    else:
        passed = _io_tests(extract_code(solution_str), test_cases, fn_name, timeout_s, memory_mb)
    return {"score": float(passed), "acc": float(passed)}


__all__ = ["BASE_IMPORTS", "compute_score", "extract_code", "final_text"]
