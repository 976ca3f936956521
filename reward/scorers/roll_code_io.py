"""ROLL's stdin/stdout and call-based code tests (the LiveCodeBench harness of
roll/utils/local_code/testing_util.py), run in the Python tool's limited child process.

This file is sent whole to the child (`program()`), so it imports nothing from hybrid. The
child runs `run_sample` once for all of a row's test cases, as ROLL's harness does, and
the whole run has ROLL's time limit, `min(timeout_s * n_cases + 1, 360)` seconds (ROLL's
per-case alarms call a handler that does nothing, so only that total limit acts).

- `fn_name` set (not empty, not "None"): call-based. The code (after ROLL's imports) is
  loaded as a module `tmp_sol`; with `class Solution` in it the method of a `Solution()`
  is called, else the module's function. Each input line is JSON, one argument each; the
  result must be JSON-serialisable and equal the expected JSON value (a tuple as a list;
  also right when it equals the first element of a non-empty expected list).
- Otherwise stdin/stdout: a final `if __name__ == '__main__':` block is unwrapped, every
  line but the top-level imports goes into a function `code()` (ROLL's rewrite), which is
  called with `sys.stdin` a StringIO of the case's input and `open()` reading it; what it
  prints is compared with ROLL's chain of comparisons: the lines joined and stripped
  (also with each line stripped); then line lists with empty expected lines dropped and
  lines stripped; then, unless every line pair is an integer, line by line as floats
  (numpy's allclose).
- The first failing case ends the run; a run with no case passes.
"""

import ast
import builtins
import io
import json
import sys
import types

# Imported before the guard runs, as in ROLL's harness (numpy's import sets environment variables).
import numpy as np


def _guard():
    # ROLL's testing_util reliability guard: these are None while the code runs.
    builtins.exit = builtins.quit = builtins.help = None
    import os
    import shutil
    import subprocess

    names = (
        "kill system putenv remove removedirs rmdir fchdir setuid forkpty killpg rename renames truncate replace "
        "unlink fchmod fchown chmod chown chroot lchflags lchmod lchown"
    )
    for name in names.split():
        setattr(os, name, None)
    shutil.rmtree = shutil.move = shutil.chown = None
    subprocess.Popen = None
    for name in ("ipdb", "joblib", "resource", "psutil", "tkinter"):
        sys.modules[name] = None


def _load(source):
    module = types.ModuleType("tmp_sol")
    exec(compile(source, "tmp_sol", "exec"), module.__dict__)
    return module


def _stdin_program(code):
    """ROLL's rewrite of a stdin/stdout program into a function `code()`."""
    try:
        tree = ast.parse(code)
        last = tree.body[-1]
        if isinstance(last, ast.If) and ast.unparse(last.test).strip() == "__name__ == '__main__'":
            code = ast.unparse(tree.body[:-1]) + "\n" + ast.unparse(last.body)
    except Exception:
        pass
    out, started = "", False
    for line in code.split("\n"):
        is_import = line.startswith("from ") or line.startswith("import ")
        if not is_import and not started:
            out += "stdin = sys.stdin\nstdout = sys.stdout\ndef code():\n\t" + line + "\n"
            started = True
        elif not is_import or started:
            out += "\t" + line + "\n"
        else:
            out += line + "\n"
    return out


def _call_with_stdin(method, inputs):
    # ROLL's stacked mock patches are entered bottom-up: read, readlines and readline are
    # patched on the stdin of before (the object a module-level `stdin` name holds), then
    # sys.stdin becomes a StringIO of the input and open() a mock_open of it. The same here,
    # by hand: unittest.mock cannot be imported in the child (it imports asyncio, whose ssl
    # import fails under the child's network block).
    lines = iter(inputs.split("\n"))
    real_stdin, real_open = sys.stdin, builtins.open
    real_stdin.read = lambda *args: inputs
    real_stdin.readlines = lambda *args: inputs.split("\n")
    real_stdin.readline = lambda *args: next(lines)
    sys.stdin = io.StringIO(inputs)
    builtins.open = lambda *args, **kwargs: io.StringIO(inputs)
    try:
        method()
    except SystemExit:
        pass
    finally:
        sys.stdin, builtins.open = real_stdin, real_open
        for name in ("read", "readlines", "readline"):
            delattr(real_stdin, name)


def _is_int(value):
    return isinstance(value, int) or (isinstance(value, str) and value.isdigit())


def _stdout_matches(printed, expected):
    output = printed.splitlines()
    if "\n".join(output).strip() == expected.strip():
        return True
    if "\n".join(line.strip() for line in output).strip() == expected.strip():
        return True
    if output == [expected]:
        return True
    expected_lines = [line.strip() for line in expected.split("\n") if len(line)]
    if output == [expected_lines] or output == expected_lines:
        return True
    output = [line for line in output if len(line)]
    if output == [expected_lines] or output == expected_lines:
        return True
    try:
        if not all(_is_int(a) and _is_int(b) for a, b in zip(output, expected_lines)):
            got = [float(line) for line in output]
            want = [float(line) for line in expected_lines]
            if len(got) == len(want) and np.allclose(got, want):
                return True
    except Exception:
        pass
    # ROLL's last comparison, a list of lines against a list of token sets, holds only when both are empty.
    return output == [] and expected_lines == []


def _int_keys(value):
    return {int(k): v for k, v in value.items()}


def _call_matches(output, expected):
    if isinstance(output, tuple):
        output = list(output)
    right = output == expected
    if isinstance(expected, list) and expected:
        right = right or output == expected[0]
    try:
        if isinstance(output[0], tuple):
            right = right or [list(x) for x in output] == expected[0]
    except Exception:
        pass
    return not (right != True)  # noqa: E712 (ROLL's test: numpy's True passes too)


def run_sample(base_imports, code, inputs, outputs, fn_name):
    """True when `code` passes every case (see the module docstring)."""
    _guard()
    call_based = bool(fn_name) and fn_name != "None"
    source = base_imports + (code if call_based else _stdin_program(code))
    try:
        module = _load(source)
        target = module.Solution() if call_based and "class Solution" in code else module
        method = getattr(target, fn_name if call_based else "code")
    except Exception:
        return False
    for case_input, case_output in zip(inputs, outputs):
        if call_based:
            arguments = [json.loads(line) for line in case_input.split("\n")]
            expected = json.loads(case_output)
            # JSON keys are strings; ROLL turns a dict's keys back into ints where it can.
            try:
                if isinstance(arguments[0], dict):
                    arguments = [_int_keys(arguments[0])]
            except Exception:
                pass
            try:
                if isinstance(expected, dict):
                    expected = [_int_keys(expected)]
            except Exception:
                pass
            try:
                if isinstance(expected[0], dict):
                    expected = [_int_keys(expected[0])]
            except Exception:
                pass
            try:
                try:
                    output = method(*arguments)
                except TypeError:
                    # ROLL retries through the class: Solution.f(*arguments), self being the first argument.
                    output = getattr(type(target), fn_name)(*arguments)
                json.dumps(output)  # ROLL serialises the result first: a set or an object fails
            except Exception:
                return False
            if not _call_matches(output, expected):
                return False
        else:
            expected = "\n".join(case_output) if isinstance(case_output, list) else case_output
            case_input = "\n".join(case_input) if isinstance(case_input, list) else case_input
            captured = io.StringIO()
            real_stdout, sys.stdout = sys.stdout, captured
            try:
                _call_with_stdin(method, case_input)
            except Exception:
                return False
            finally:
                sys.stdout = real_stdout
            if not _stdout_matches(captured.getvalue(), expected):
                return False
    return True


def program(base_imports, code, inputs, outputs, fn_name, marker):
    """The child's source: this file, then the run, its verdict printed after `marker`."""
    with open(__file__) as f:
        harness = f.read()
    call = (
        f"_verdict = run_sample({base_imports!r}, {code!r}, {list(inputs)!r}, {list(outputs)!r}, {fn_name!r})\n"
        f"sys.__stdout__.write({marker!r} + str(bool(_verdict)) + '\\n')\n"
        "sys.__stdout__.flush()\n"
    )
    return harness + "\n" + call
