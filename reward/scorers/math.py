"""MATH-style scoring: the last `\\boxed{...}` answer of a response against the reference.

Answers are compared after normalisation (the usual MATH answer cleaning: `\\left`/
`\\right`, spaces, `\\dfrac`/`\\tfrac`, `\\frac12`, `a/b`, units in `\\text{...}`, degrees,
percent, dollars, a leading `x =`), and, when both sides read as numbers, by value, so
`0.5`, `\\frac{1}{2}`, `1/2` and `\\frac12` are the same answer, and so are
`\\frac{\\sqrt{2}}{2}` and `\\sqrt{2}/2`.
"""

from __future__ import annotations

import ast
import math
import operator
import re

# Relative tolerance of the numeric comparison: only float rounding, not approximations.
_REL_TOL = 1e-9
# Powers larger than this are not evaluated (a response could ask for 9^9^9).
_MAX_EXPONENT = 64
_MAX_BASE = 1e12


def last_boxed_only_string(text: str) -> str | None:
    """The last `\\boxed{...}` (or `\\fbox{...}`, or `\\boxed 5`) of `text`, braces matched."""
    idx = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if idx < 0:
        return None
    if text.startswith("\\boxed ", idx):
        # The brace-less form ends at the closing dollar or the end of the text.
        rest = text[idx + len("\\boxed ") :]
        return "\\boxed " + rest.split("$")[0].strip()
    depth = 0
    for i in range(idx, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[idx : i + 1]
    return None


def remove_boxed(boxed: str) -> str:
    for prefix in ("\\boxed ", "\\boxed{", "\\fbox{"):
        if boxed.startswith(prefix):
            inner = boxed[len(prefix) :]
            return inner if prefix.endswith(" ") else inner[:-1]
    raise ValueError(f"not a boxed answer: {boxed!r}")


def extract_boxed_answer(text: str) -> str | None:
    boxed = last_boxed_only_string(text)
    return None if boxed is None else remove_boxed(boxed)


def _matching_brace(s: str, open_idx: int) -> int:
    depth = 0
    for i in range(open_idx, len(s)):
        if s[i] == "{":
            depth += 1
        elif s[i] == "}":
            depth -= 1
            if depth == 0:
                return i
    return -1


def _fix_fracs(s: str) -> str:
    """`\\frac12` -> `\\frac{1}{2}`, `\\frac1{2}` -> `\\frac{1}{2}`, `\\frac{1}2` likewise."""
    parts = s.split("\\frac")
    out = parts[0]
    for part in parts[1:]:
        out += "\\frac"
        args = []
        rest = part
        for _ in range(2):
            if rest.startswith("{"):
                end = _matching_brace(rest, 0)
                if end < 0:
                    return s
                args.append(rest[: end + 1])
                rest = rest[end + 1 :]
            elif rest:
                args.append("{" + rest[0] + "}")
                rest = rest[1:]
            else:
                return s
        out += "".join(args) + rest
    return out


def _fix_sqrt(s: str) -> str:
    return re.sub(r"\\sqrt(\w)", r"\\sqrt{\1}", s)


def _fix_a_slash_b(s: str) -> str:
    m = re.fullmatch(r"(-?\d+)/(\d+)", s)
    return f"\\frac{{{m.group(1)}}}{{{m.group(2)}}}" if m else s


def _remove_trailing_units(s: str) -> str:
    # "5\text{ cm}", "5\mbox{ inches}", "5\text{ cm}^2": a unit is text after a value.
    m = re.search(r"\\(?:text|mbox|mathrm)\{[^{}]*\}(\^\{?\d\}?)?$", s)
    if m and s[: m.start()].strip():
        return s[: m.start()].strip()
    return s


def normalize_answer(answer: str) -> str:
    """Canonical text of a MATH answer; equal answers in the usual forms become equal."""
    s = str(answer).strip().replace("\n", "")
    s = s.replace("\\!", "").replace("\\,", "").replace("\\;", "").replace("\\:", "")
    s = s.replace("\\\\", "\\")
    s = s.replace("\\displaystyle", "")
    s = s.replace("tfrac", "frac").replace("dfrac", "frac")
    s = s.replace("\\left", "").replace("\\right", "")
    s = s.replace("^{\\circ}", "").replace("^\\circ", "").replace("\\circ", "")
    s = s.replace("\\$", "").replace("$", "")
    s = s.strip().rstrip(".").strip()
    s = _remove_trailing_units(s)
    s = re.sub(r"\\(?:text|mbox|mathrm)\{([^{}]*)\}", r"\1", s)
    s = s.replace("\\%", "").replace("%", "")
    s = s.replace(" .", " 0.").replace("{.", "{0.")
    if s.startswith("."):
        s = "0" + s
    # "x = 5" and "k=5": keep the value when the left side is a short name.
    if s.count("=") == 1 and len(s.split("=")[0].strip()) <= 2:
        s = s.split("=")[1]
    s = _fix_sqrt(s)
    s = s.replace(" ", "")
    s = _fix_fracs(s)
    s = _fix_a_slash_b(s)
    s = s.rstrip(".")
    # A thousands separator inside a lone number: "1,000" is 1000, "(1,2)" stays a pair.
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", s):
        s = s.replace(",", "")
    return s


_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def _eval_node(node) -> float:
    if isinstance(node, ast.Expression):
        return _eval_node(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return float(node.value)
    if isinstance(node, ast.Name) and node.id == "pi":
        return math.pi
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _eval_node(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        return _BINOPS[type(node.op)](_eval_node(node.left), _eval_node(node.right))
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
        base, exponent = _eval_node(node.left), _eval_node(node.right)
        if abs(exponent) > _MAX_EXPONENT or abs(base) > _MAX_BASE:
            raise OverflowError("power too large to compare")
        return base**exponent
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "sqrt"
        and len(node.args) == 1
        and not node.keywords
    ):
        return math.sqrt(_eval_node(node.args[0]))
    raise ValueError(f"not a numeric expression: {ast.dump(node)}")


def _latex_to_python(s: str) -> str | None:
    """A Python expression for a normalised answer built from numbers and + - * / ^,
    fractions, square roots and pi; None when it holds anything else."""
    out = s
    # Innermost first, so nested fractions and roots unwrap from the inside.
    for _ in range(32):
        m = re.search(r"\\frac\{([^{}]*)\}\{([^{}]*)\}", out)
        if m:
            out = out[: m.start()] + f"(({m.group(1)})/({m.group(2)}))" + out[m.end() :]
            continue
        m = re.search(r"\\sqrt\[([^\[\]{}]*)\]\{([^{}]*)\}", out)
        if m:
            out = out[: m.start()] + f"(({m.group(2)})**(1/({m.group(1)})))" + out[m.end() :]
            continue
        m = re.search(r"\\sqrt\{([^{}]*)\}", out)
        if m:
            out = out[: m.start()] + f"sqrt({m.group(1)})" + out[m.end() :]
            continue
        break
    out = out.replace("\\pi", "pi").replace("\\cdot", "*").replace("\\times", "*")
    out = out.replace("{", "(").replace("}", ")").replace("^", "**")
    if "\\" in out or not re.fullmatch(r"[0-9.+\-*/() a-z]+", out):
        return None
    if re.search(r"[a-z]+", out) and set(re.findall(r"[a-z]+", out)) - {"pi", "sqrt"}:
        return None
    # Implicit products: "2sqrt(3)", "2pi", ")(".
    out = re.sub(r"(?<=[\d)])(?=[a-z(])", "*", out)
    out = re.sub(r"(?<=pi)(?=[\d(a-z])", "*", out)
    return out


def to_number(normalized: str) -> float | None:
    """The value of a normalised answer, or None when it is not a plain number/expression."""
    expression = _latex_to_python(normalized)
    if expression is None:
        return None
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError:
        return None
    try:
        value = _eval_node(tree)
    except (ValueError, ZeroDivisionError, OverflowError):
        # Not a number we can compare by value; the text comparison already decided.
        return None
    return value if math.isfinite(value) else None


def is_equiv(answer: str, reference: str) -> bool:
    a, b = normalize_answer(answer), normalize_answer(reference)
    if a == b:
        return True
    x, y = to_number(a), to_number(b)
    if x is None or y is None:
        return False
    return math.isclose(x, y, rel_tol=_REL_TOL, abs_tol=1e-12)


def compute_score(solution_str: str, ground_truth: str) -> float:
    """1.0 when the last boxed answer of `solution_str` equals `ground_truth`, else 0.0."""
    answer = extract_boxed_answer(solution_str)
    if answer is None:
        return 0.0
    reference = str(ground_truth)
    if "\\boxed" in reference or "\\fbox" in reference:
        reference = extract_boxed_answer(reference) or reference
    return 1.0 if is_equiv(answer, reference) else 0.0
