"""The words of a launch script's training command, read without running it.

A Megatron-LM launch script is bash: variables (`TP=8`, `${TP:-8}`, `$((A*B))`), arrays
(`ARGS=( --a 1 )`, `ARGS+=(...)`, `"${ARGS[@]}"`), backslash continuations, comments and
`if [[ "$X" == "y" ]]; then ... else ... fi` around some of them. `command_words` follows
that much of bash (assignments in order, the branch whose test it can decide) and returns the
words after the Python script of the `torchrun`/`python` line; what it cannot decide is
reported in `unsure`, never guessed silently.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

from ..errors import PlanError

_ASSIGN = re.compile(r"^(?:export\s+|declare\s+(?:-\w+\s+)*|local\s+)?([A-Za-z_]\w*)(\+?)=(.*)$", re.S)
_VAR = re.compile(r"\$\{([A-Za-z_]\w*)(\[@\]|\[\*\])?(?::?([-=])((?:[^{}]|\{[^{}]*\})*))?\}|\$([A-Za-z_]\w*|\d)")
_ARITH = re.compile(r"\$\(\(([^()]*)\)\)")
_COMMAND_SUB = re.compile(r"\$\([^()]*\)|`[^`]*`")
_TEST = re.compile(r"""^\[\[?\s*(?P<a>"[^"]*"|'[^']*'|\S+)\s*(?P<op>==|=|!=)\s*(?P<b>"[^"]*"|'[^']*'|\S+)\s*\]?\]$""")
_TEST_FILE = re.compile(r"""^\[\[?\s*(?P<neg>!\s+)?-[fde]\s+\S+\s*\]?\]$""")
_TEST_EMPTY = re.compile(r"""^\[\[?\s*(?P<op>-n|-z)\s+(?P<a>"[^"]*"|'[^']*'|\S+)\s*\]?\]$""")


# bash arithmetic is 64-bit: anything beyond is not a launch setting (and a power tower such as
# 9**9**9**9 must not be computed at all)
ARITH_LIMIT = 2**63


def arithmetic(expr: str) -> int | None:
    """The value of a bash `$((...))` of integers and + - * / % ** ( ), or None when it is not
    one, divides by zero or leaves 64 bits. Evaluated on its syntax tree, operand by operand."""
    import ast

    def quotient(a: int, b: int) -> int:  # bash truncates toward zero
        q = abs(a) // abs(b)
        return q if (a < 0) == (b < 0) else -q

    ops = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
           ast.FloorDiv: quotient, ast.Mod: lambda a, b: a - quotient(a, b) * b}

    def ev(node) -> int:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = ev(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.BinOp):
            a, b = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Pow):
                if b < 0 or (abs(a) > 1 and b >= 64):
                    raise OverflowError
                v = a ** b
            elif type(node.op) in ops:
                v = ops[type(node.op)](a, b)
            else:
                raise ValueError
            if abs(v) >= ARITH_LIMIT:
                raise OverflowError
            return v
        raise ValueError

    try:
        return ev(ast.parse(expr.replace("/", "//"), mode="eval").body)
    except (SyntaxError, ValueError, OverflowError, ZeroDivisionError, RecursionError):
        return None


@dataclass
class ShellRead:
    """What a script runs: its command's words, and what could not be decided."""

    words: list[str]
    script: str | None  # the Python script the words are passed to (pretrain_gpt.py), if any
    unsure: list[str] = field(default_factory=list)
    launcher: list[str] = field(default_factory=list)  # the words before the script (torchrun and its flags)
    from_vars: list[str] = field(default_factory=list)  # no command: the variables whose flags were read
    env: dict = field(default_factory=dict)  # NAME=value words before the command
    variables: dict = field(default_factory=dict)  # the script's string variables at its end


def _statements(text: str) -> list[str]:
    """The script as statements: continuations joined, comments dropped, arrays kept whole."""
    text = re.sub(r"\\\r?\n", " ", text)
    out, pending, depth = [], "", 0
    for raw in text.splitlines():
        line = raw.strip() if _open_quote(pending) else _strip_comment(raw).strip()
        if not line:
            continue
        pending = f"{pending} {line}" if pending else line
        if _open_quote(pending):  # a quoted string that goes on over lines
            continue
        depth += line.count("(") - line.count(")")
        if depth > 0:
            continue
        depth = 0
        out += [s.strip() for s in _split_semicolons(pending) if s.strip()]
        pending = ""
    if pending:
        out.append(pending)
    return out


def _open_quote(s: str) -> str | None:
    """The quote character left open at the end of `s`, if any."""
    quote = None
    escaped = False
    for ch in s:
        if escaped:
            escaped = False
        elif ch == "\\" and quote != "'":
            escaped = True
        elif quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
    return quote


def _strip_comment(line: str) -> str:
    """The line without its comment: a `#` that starts a word outside quotes."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1] in " \t(") and not line[i - 1:i + 1] == "$#":
            return line[:i]
    return line


def _split_semicolons(s: str) -> list[str]:
    parts, quote, cur = [], None, ""
    for ch in s:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == ";":
            parts.append(cur)
            cur = ""
            continue
        cur += ch
    return parts + [cur]


class _Shell:
    def __init__(self, positional: list[str] | None = None):
        self.vars: dict[str, list[str] | str] = {}
        self.positional = positional or []
        self.unsure: list[str] = []
        self.order: list[str] = []  # variables in the order they were first set

    def value(self, name: str) -> str:
        if name.isdigit():
            i = int(name)
            return self.positional[i - 1] if 0 < i <= len(self.positional) else ""
        v = self.vars.get(name, "")
        return " ".join(v) if isinstance(v, list) else v

    def expand(self, s: str) -> str:
        """Variables, defaults (${X:-d}), arithmetic ($((...))); command substitutions become empty."""
        def arith(m):
            expr = self.expand(m.group(1).replace("$", ""))
            expr = re.sub(r"[A-Za-z_]\w*", lambda v: self.value(v.group(0)) or "0", expr)
            if re.fullmatch(r"[\d\s+\-*/%()]+", expr):
                value = arithmetic(expr)
                if value is not None:
                    return str(value)
            self.unsure.append(f"$(({m.group(1)}))")
            return ""

        def var(m):
            name = m.group(1) or m.group(5)
            v = self.value(name)
            if m.group(3) and not v:
                v = self.expand(m.group(4) or "")
                if len(v) >= 2 and v[0] == v[-1] and v[0] in "'\"":
                    v = v[1:-1]
                if m.group(3) == "=":
                    self.vars[name] = v
            return v

        s = _ARITH.sub(arith, s)
        s = _COMMAND_SUB.sub("", s)
        return _VAR.sub(var, s)

    def words(self, s: str) -> list[str]:
        """Expanded, then split as bash splits unquoted expansions (quotes respected); "${A[@]}"
        is each element of A as a word."""
        def elements(m):
            v = self.vars.get(m.group(1), "")
            return " ".join(shlex.quote(x) for x in (v if isinstance(v, list) else [v]))

        s = re.sub(r'"\$\{([A-Za-z_]\w*)\[@\]\}"', elements, s)
        try:
            return shlex.split(self.expand(s), comments=False)
        except ValueError as exc:
            raise PlanError("from", f"cannot read the shell words {s[:80]!r} ({exc})") from None

    def test(self, cond: str) -> bool | None:
        """A test bash would run: [[ "$A" == "b" ]], [ -n "$X" ], joined by || or &&; None if undecidable."""
        cond = cond.strip()
        for op in ("||", "&&"):
            if op in cond:
                parts = [self.test(c) for c in cond.split(op)]
                if None in parts:
                    return None
                return any(parts) if op == "||" else all(parts)
        m = _TEST.match(cond)
        if m:
            a, b = (self.words(m.group(k)) for k in ("a", "b"))
            equal = " ".join(a) == " ".join(b)
            return equal if m.group("op") != "!=" else not equal
        m = _TEST_FILE.match(cond)
        if m:  # a guard that the script's files exist: read as a script run where it belongs
            return not m.group("neg")
        m = _TEST_EMPTY.match(cond)
        if m:
            empty = not " ".join(self.words(m.group("a")))
            return empty if m.group("op") == "-z" else not empty
        return None


def python_script(words: list[str], env: dict) -> int | None:
    """Where a Megatron-LM command's arguments start: after its Python script (pretrain_gpt.py)."""
    script = next((i for i, w in enumerate(words) if w.endswith(".py")), None)
    if script is not None and any(w.startswith("--") for w in words[script + 1:]):
        return script
    return None


def _env_prefix(words: list[str]) -> tuple[dict, list[str]]:
    """`A=1 B=2 cmd ...`: the environment given to the command, and the command."""
    env = {}
    while words and re.match(r"^[A-Za-z_]\w*=", words[0]):
        k, _, v = words[0].partition("=")
        env[k] = v
        words = words[1:]
    return env, words


def _is_assignment(value: str) -> bool:
    """NAME=value alone (an array, or one word), not NAME=value before a command."""
    if value.startswith("("):
        return True
    try:
        return len(shlex.split(value)) <= 1
    except ValueError:
        return True


def command_words(text: str, positional: list[str] | None = None, select=python_script) -> ShellRead:
    """The words given to the command `select` recognises (by default the Python script of a
    `torchrun ... pretrain_gpt.py` line: the words after it), or, for a plain arguments file,
    every word of its statements that start with an option."""
    sh = _Shell(positional)
    stack: list[bool] = []  # the state of each enclosing if: are we in the branch taken?
    taken: list[bool] = []  # has a branch of each enclosing if been taken?
    found: ShellRead | None = None
    plain: list[str] = []
    for st in _statements(text):
        head = st.split(None, 1)[0]
        rest = st[len(head):].strip()
        if head in ("if", "elif"):
            cond = rest.removesuffix("then").strip()
            outer = all(stack[:-1]) if head == "elif" else all(stack)
            decided = sh.test(cond) if outer else False
            if decided is None:
                sh.unsure.append(f"the condition {cond!r} (its branch was read)")
                decided = True
            if head == "if":
                stack.append(decided)
                taken.append(decided)
            else:
                stack[-1] = decided and not taken[-1]
                taken[-1] = taken[-1] or decided
            continue
        if head == "then":
            if rest:
                st, head = rest, rest.split(None, 1)[0]
            else:
                continue
        if head == "else" and stack:
            stack[-1] = not taken[-1]
            taken[-1] = True
            if not rest:
                continue
            st, head = rest, rest.split(None, 1)[0]
        if head == "fi" and stack:
            stack.pop()
            taken.pop()
            continue
        if not all(stack):
            continue
        m = _ASSIGN.match(st)
        if m and _is_assignment(m.group(3).strip()):
            name, append, value = m.groups()
            value = value.strip()
            if name not in sh.order:
                sh.order.append(name)
            if value.startswith("(") and value.endswith(")"):
                items = sh.words(value[1:-1])
                old = sh.vars.get(name, []) if append else []
                sh.vars[name] = (old if isinstance(old, list) else [old]) + items
            else:
                words = sh.words(value) if value else [""]
                sh.vars[name] = (sh.value(name) if append else "") + " ".join(words)
            continue
        env, words = _env_prefix(sh.words(st))
        start = select(words, env)
        if start is not None:
            found = ShellRead(words[start + 1:], words[start], [], words[:start], env=env)
        elif words and words[0].startswith("--"):
            plain += words
    from_vars: list[str] = []
    if found is None and not plain:
        # no command: a file of settings (sourced by a launcher) whose variables hold the flags
        for name in sh.order:
            words = sh.vars[name] if isinstance(sh.vars[name], list) else sh.words(sh.vars[name])
            if words and words[0].startswith("--"):
                plain += words
                from_vars.append(name)
    if found is None:
        found = ShellRead(plain, None, [])
    found.unsure = sh.unsure
    found.from_vars = from_vars
    found.variables = {k: v for k, v in sh.vars.items() if isinstance(v, str)}
    return found
