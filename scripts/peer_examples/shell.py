"""Just enough of bash to read a launch script's command lines without running anything.

`commands(text, env, args)` walks a script top to bottom and returns every simple command it
would run on the default path, each with its words after expansion. What it understands:

- variables: `VAR=value` (also `export VAR=value`, and `VAR=value cmd ...` for that command),
  `: "${VAR:=default}"`, `${VAR:-default}`, `${VAR:?message}`, `$VAR`, `${VAR}`, `$@` / `"$@"`
  (the script's arguments), `$((arithmetic))`; `$(date ...)` gives a fixed time stamp,
  `$(cd -- "$(dirname ...)" && pwd)` the script's folder, any other `$(...)` an empty word
  (recorded);
- quoting: single quotes keep everything, double quotes keep words together, an unquoted
  expansion is split on white space;
- `if [ ... ]; then ... else ... fi` with string tests (`=`, `!=`, `-z`, `-n`) evaluated;
  file tests (`-f`, `-d`, `-x`, `-e`) are false (no file of the user's exists here);
- line continuations and comments.

Loops, functions and pipelines are read as plain commands (their bodies are not repeated);
a script that needs them is reported by the caller as having no readable training command.
"""

from __future__ import annotations

import re

FIXED_DATE = "20260101_000000"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class Expander:
    """Expands one logical line of shell into words, with the variables seen so far."""

    def __init__(self, env: dict[str, str], args: list[str], script_dir: str):
        self.env, self.args, self.script_dir = env, args, script_dir
        self.substitutions: list[str] = []  # $(...) read as an empty word
        self.required: list[str] = []  # ${VAR:?...} with VAR unset

    # -- one ${...} / $NAME / $(...)
    def _param(self, body: str) -> str:
        match = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)(?::?([-=?+])(.*))?", body, re.S)
        if not match:
            if body.startswith("#"):  # ${#VAR}: its length
                return str(len(self.env.get(body[1:], "")))
            return ""
        name, op, word = match.group(1), match.group(2), match.group(3)
        value = self.env.get(name)
        unset_or_empty = value is None or (value == "" and ":" in body[len(name) : len(name) + 1])
        if op is None:
            return value or ""
        word_value = self.words_of(word or "", split=False)
        if op == "-":
            return word_value if unset_or_empty else value
        if op == "=":
            if unset_or_empty:
                self.env[name] = word_value
                return word_value
            return value
        if op == "?":
            if unset_or_empty:
                self.required.append(name)
                return f"<{name}>"
            return value
        return "" if unset_or_empty else word_value  # "+"

    def _command(self, body: str) -> str:
        if body.strip().startswith("date"):
            return FIXED_DATE
        if "dirname" in body and "pwd" in body:
            return self.script_dir
        if "python" in body:  # a helper that finds the Python interpreter to use
            return "python"
        self.substitutions.append(body.strip())
        return ""

    def _arith(self, body: str) -> str:
        expr = re.sub(r"\$?\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda m: self.env.get(m.group(1), "0") or "0", body)
        if not re.fullmatch(r"[\d\s+\-*/%()]*", expr):
            return ""
        return str(int(eval(expr.replace("/", "//"))))  # noqa: S307 - digits and operators only

    @staticmethod
    def _closing(text: str, start: int, open_: str, close: str) -> int:
        depth, i = 1, start
        while i < len(text):
            if text[i] == "\\":
                i += 2
                continue
            if text.startswith(open_, i):
                depth += 1
                i += len(open_)
                continue
            if text.startswith(close, i):
                depth -= 1
                if depth == 0:
                    return i
                i += len(close)
                continue
            i += 1
        raise ValueError(f"no closing {close!r} in {text[start - 2 :][:60]!r}")

    def _dollar(self, text: str, i: int) -> tuple[list[str] | str, int]:
        """Expansion at text[i] == '$': (value or the list of "$@" words, next index)."""
        if text.startswith("$((", i):
            end = self._closing(text, i + 3, "((", "))")
            return self._arith(text[i + 3 : end]), end + 2
        if text.startswith("$(", i):
            end = self._closing(text, i + 2, "(", ")")
            return self._command(text[i + 2 : end]), end + 1
        if text.startswith("${", i):
            end = self._closing(text, i + 2, "{", "}")
            body = text[i + 2 : end]
            if body in ("@", "*") or body.endswith("[@]"):
                return list(self.args) if body in ("@", "*") else [], end + 1
            return self._param(body), end + 1
        if i + 1 < len(text) and text[i + 1] in "@*":
            return list(self.args), i + 2
        if i + 1 < len(text) and text[i + 1].isdigit():
            n = int(text[i + 1])
            return (self.args[n - 1] if 0 < n <= len(self.args) else ""), i + 2
        match = _NAME.match(text, i + 1)
        if match:
            return self.env.get(match.group(0), ""), match.end()
        return "$", i + 1

    def words_of(self, text: str, split: bool = True) -> str | list[str]:
        """The words of `text` (or, with split=False, its expansion as one string)."""
        words: list[str] = []
        current: list[str] = []
        has_word = False
        i = 0

        def flush() -> None:
            nonlocal current, has_word
            if has_word:
                words.append("".join(current))
            current, has_word = [], False

        while i < len(text):
            c = text[i]
            if c == "\\" and i + 1 < len(text):
                current.append(text[i + 1])
                has_word = True
                i += 2
            elif c == "'":
                end = text.index("'", i + 1)
                current.append(text[i + 1 : end])
                has_word = True
                i = end + 1
            elif c == '"' and text.startswith(('"$@"', '"${@}"'), i) and not self.args:
                i = text.index('"', i + 1) + 1  # "$@" with no arguments is no word at all
            elif c == '"':
                i += 1
                while i < len(text) and text[i] != '"':
                    if text[i] == "\\" and i + 1 < len(text) and text[i + 1] in '"\\$`':
                        current.append(text[i + 1])
                        i += 2
                    elif text[i] == "$":
                        value, i = self._dollar(text, i)
                        if isinstance(value, list):  # "$@": one word per argument
                            for n, arg in enumerate(value):
                                if n:
                                    flush()
                                current.append(arg)
                                has_word = True
                        else:
                            current.append(value)
                    else:
                        current.append(text[i])
                        i += 1
                has_word = True
                i += 1
            elif c == "$":
                value, i = self._dollar(text, i)
                parts = value if isinstance(value, list) else (value.split() if split else [value])
                if isinstance(value, str) and split and value[:1].isspace():
                    flush()
                for n, part in enumerate(parts):
                    if n:
                        flush()
                    current.append(part)
                    has_word = True
                if isinstance(value, str) and split and value[-1:].isspace():
                    flush()
            elif c.isspace() and split:
                flush()
                i += 1
            else:
                current.append(c)
                has_word = True
                i += 1
        flush()
        return words if split else "".join(words)


def logical_lines(text: str) -> list[str]:
    """Lines with continuations joined, comments and blank lines dropped, `;` splitting
    `if ...; then` into its parts."""
    joined = re.sub(r"\\\n", " ", _drop_heredocs(text))
    lines, pending = [], ""
    for raw in joined.splitlines():
        line = (pending + " " + _strip_comment(raw).strip()).strip()
        if _open_brackets(line) > 0:  # $( or ${ continued on the next line
            pending = line
            continue
        pending = ""
        if not line:
            continue
        for part in _split_semicolons(line):
            if part.strip():
                lines.append(part.strip())
    return lines


_HEREDOC = re.compile(r"<<-?\s*['\"]?([A-Za-z_][A-Za-z0-9_]*)['\"]?")


def _drop_heredocs(text: str) -> str:
    """The text without here-document bodies (their words are data, not commands)."""
    out, end = [], None
    for line in text.splitlines():
        if end is not None:
            if line.strip() == end:
                end = None
            continue
        out.append(line)
        match = _HEREDOC.search(_strip_comment(line))
        if match:
            end = match.group(1)
    return "\n".join(out)


def _open_brackets(line: str) -> int:
    """How many ( and { stay open at the end of the line (an open quote counts as one)."""
    depth, quote = 0, None
    for i, c in enumerate(line):
        if quote == "'":
            quote = None if c == "'" else quote
        elif c == quote and line[i - 1] != "\\":
            quote = None
        elif c in "'\"" and quote is None:
            quote = c
        elif c in "({":
            depth += 1
        elif c in ")}":
            depth -= 1
    return depth + (quote is not None)


def _unquoted(line: str):
    """(index, character) of each character outside quotes, the quote marks left out."""
    quote = None
    for i, c in enumerate(line):
        if quote:
            if c == quote:
                quote = None
        elif c in "'\"":
            quote = c
        else:
            yield i, c


def _strip_comment(line: str) -> str:
    for i, c in _unquoted(line):
        if c == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def _split_semicolons(line: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, c in _unquoted(line):
        if c in "({":
            depth += 1
        elif c in ")}":
            depth -= 1
        elif c == ";" and depth == 0 and not line[i + 1 : i + 2] == ";":
            parts.append(line[start:i])
            start = i + 1
    parts.append(line[start:])
    return parts


_ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=")


def _test(words: list[str]) -> bool:
    """`[ ... ]` / `[[ ... ]]` / `test ...` on expanded words (file tests are false)."""
    words = [w for w in words if w not in ("[", "]", "[[", "]]", "test")]
    if words[:1] == ["!"]:
        return not _test(words[1:])
    if len(words) == 3 and words[1] in ("=", "==", "!="):
        return (words[0] == words[2]) == (words[1] != "!=")
    if len(words) == 2 and words[0] in ("-z", "-n"):
        return (words[1] == "") == (words[0] == "-z")
    if len(words) == 1:
        return words[0] != ""
    return False  # -f, -d, -x, -e and anything else


def commands(text: str, env: dict[str, str], args: list[str], script_dir: str) -> tuple[list[dict], Expander]:
    """Every simple command on the default path: [{"env": {VAR: value}, "words": [...]}]."""
    expander = Expander(env, args, script_dir)
    found: list[dict] = []
    # a stack of [taking this branch, a branch already taken] for nested if blocks
    stack: list[list[bool]] = []

    def active() -> bool:
        return all(taking for taking, _ in stack)

    for line in logical_lines(text):
        head = line.split(None, 1)[0]
        rest = line[len(head) :].strip()
        if head in ("if", "elif"):
            if head == "if":
                stack.append([False, False])
            frame = stack[-1]
            parent = all(taking for taking, _ in stack[:-1])
            result = parent and not frame[1] and _test(expander.words_of(rest))
            frame[0], frame[1] = result, frame[1] or result
            continue
        if head == "then":
            if rest:
                line, head = rest, rest.split(None, 1)[0]
                rest = line[len(head) :].strip()
            else:
                continue
        if head == "else":
            frame = stack[-1]
            frame[0] = not frame[1]
            continue
        if head == "fi":
            stack.pop()
            continue
        if not active():
            continue
        words = expander.words_of(line)
        if not words:
            continue
        if words[0] == "export":
            words = words[1:]
        assignments: dict[str, str] = {}
        while words and _ASSIGN.match(words[0]):
            name, _, value = words.pop(0).partition("=")
            assignments[name] = value
        if not words:
            env.update(assignments)  # a line of assignments only
            continue
        if words[0] in (":", "set", "echo", "mkdir", "cd", "source", "."):
            continue
        found.append({"env": assignments, "words": words})
    return found, expander


__all__ = ["FIXED_DATE", "Expander", "commands", "logical_lines"]
