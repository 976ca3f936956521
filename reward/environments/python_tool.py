"""The built-in tool: a Python calculator that runs the model's code in a subprocess.

`{"name": "python", "arguments": {"code": "print(23 * 45)"}}` runs the code with the same
interpreter in isolated mode (`-I`: no user site, no PYTHON* variables), an empty
environment, a fresh temporary working directory, a CPU-time, memory and file-size
limit, and a wall-clock limit (`config.timeout_s`, default 5 s) after which its whole
process group is killed. Network: the child first tries to move itself into an empty
network namespace (works where the kernel allows it, e.g. as root); in any case it
replaces the socket constructors before the code runs, so `socket`, `urllib`, `requests`
and the like fail. That block is made for a calculator, not as a sandbox against a
determined adversary: code that loads C libraries could get around it where the namespace
could not be made. As at a Python prompt, a final bare expression prints its value, so
`23 * 45` answers `1035`. The answer is stdout (and the error's last line when the code
raised), or "Error: timed out after N s".
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Any

# Run inside the child before the model's code (read from stdin).
_RUNNER = r"""
import ast, resource, sys
limit_mb, cpu_s = int(sys.argv[1]), int(sys.argv[2])
try:
    import ctypes
    ctypes.CDLL(None, use_errno=True).unshare(0x40000000)  # CLONE_NEWNET: no interfaces at all
except Exception:
    pass
import socket, _socket
def _no_network(*args, **kwargs):
    raise OSError("network access is disabled in the python tool")
for _module in (socket, _socket):
    for _name in ("socket", "create_connection", "create_server", "socketpair", "fromfd", "getaddrinfo"):
        if hasattr(_module, _name):
            setattr(_module, _name, _no_network)
resource.setrlimit(resource.RLIMIT_AS, (limit_mb << 20, limit_mb << 20))
resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
source = sys.stdin.read()
tree = ast.parse(source, "<tool>")
if tree.body and isinstance(tree.body[-1], ast.Expr):
    call = ast.Call(ast.Name("__show__", ast.Load()), [tree.body[-1].value], [])
    tree.body[-1] = ast.Expr(call)
    ast.fix_missing_locations(tree)
def __show__(value):
    if value is not None:
        print(repr(value))
exec(compile(tree, "<tool>", "exec"), {"__name__": "__main__", "__show__": __show__})
"""


@dataclass(frozen=True)
class PythonRun:
    """What one run of `execute_python` gave: exit status (None when it timed out), stdout, stderr."""

    returncode: int | None
    stdout: str
    stderr: str

    @property
    def timed_out(self) -> bool:
        return self.returncode is None


def execute_python(code: str, timeout_s: float = 5.0, memory_mb: int = 512) -> PythonRun:
    """Run `code` in the limited child (see the module docstring); the reward scorers that
    run programs (reward/scorers/roll_code.py) read the exit status from here."""
    cpu_s = max(1, int(timeout_s) + 1)
    with tempfile.TemporaryDirectory(prefix="python_tool_") as workdir:
        process = subprocess.Popen(
            [sys.executable, "-I", "-c", _RUNNER, str(memory_mb), str(cpu_s)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=workdir,
            env={"PATH": os.defpath},
            start_new_session=True,
            text=True,
        )
        try:
            out, err = process.communicate(code, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            # The session holds anything the code started; kill all of it.
            os.killpg(process.pid, signal.SIGKILL)
            out, err = process.communicate()
            return PythonRun(None, out, err)
    return PythonRun(process.returncode, out, err)


def run_python(code: str, timeout_s: float = 5.0, memory_mb: int = 512) -> str:
    """The answer text of running `code` (see the module docstring)."""
    run = execute_python(code, timeout_s, memory_mb)
    if run.timed_out:
        return f"Error: timed out after {timeout_s:g} s"
    out, err = run.stdout, run.stderr
    if run.returncode != 0:
        last = (err.strip().splitlines() or [f"exit status {run.returncode}"])[-1]
        return (out + ("\n" if out and not out.endswith("\n") else "") + f"Error: {last}").strip()
    return out.strip() or "(no output)"


class PythonTool:
    """verl's tool interface (create/execute/release) around `run_python`."""

    DEFAULT_SCHEMA = {
        "type": "function",
        "function": {
            "name": "python",
            "description": "Run Python code and return what it prints (a final bare expression is printed).",
            "parameters": {
                "type": "object",
                "properties": {"code": {"type": "string", "description": "Python source, e.g. 23 * 45"}},
                "required": ["code"],
            },
        },
    }

    def __init__(self, config: dict | None = None, tool_schema: Any = None):
        # The tool's own YAML options (verl keeps them as `self.config`), not hybrid's config.
        options = dict(config or {})
        self.config = options
        self.tool_schema = tool_schema or self.DEFAULT_SCHEMA
        self.timeout_s = float(options.get("timeout_s", 5.0))
        self.memory_mb = int(options.get("memory_mb", 512))

    def execute(self, instance_id: str, parameters: dict, **kwargs) -> tuple[str, float, dict]:
        code = parameters.get("code") if isinstance(parameters, dict) else None
        if not isinstance(code, str) or not code.strip():
            return 'Error: the python tool needs {"code": "<python source>"}', 0.0, {}
        return run_python(code, self.timeout_s, self.memory_mb), 0.0, {}
