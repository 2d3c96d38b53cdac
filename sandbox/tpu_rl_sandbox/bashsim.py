"""A small bash interpreter for the commands the fakes must "run".

``gcluster job submit --command CMD`` runs ``/bin/bash -c CMD`` in the pod and
``gcloud compute ssh VM --command 'bash -s'`` runs the script read from stdin on the VM. The
fakes read those strings the way bash would: quoting, ``$VAR``/``${VAR:-x}``/``${VAR?}``,
``$(...)``, ``$((...))``, ``&&``/``||``/``;``/``|``, ``( ... )``, ``{ ...; }``, ``if``, redirections,
``export``, ``VAR=value cmd``, ``set -euo pipefail`` (with bash's real ``set -e`` exceptions), and
``command not found`` (127) for anything the host does not provide. Commands themselves are
supplied by a :class:`ShellHost` (the pod or the VM).

Unsupported constructs (here-documents, loops, ``case``, functions) are reported as errors
rather than guessed at.
"""

from __future__ import annotations

import ast
import io
import operator
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
ASSIGN_RE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=")
OPERATOR_CHARS = set(";&|()<>")
RESERVED = {
    "if",
    "then",
    "elif",
    "else",
    "fi",
    "{",
    "}",
    "!",
    "while",
    "until",
    "for",
    "do",
    "done",
    "case",
    "esac",
    "function",
    "select",
    "[[",
}
UNSUPPORTED_KEYWORDS = {"while", "until", "for", "do", "done", "case", "esac", "function", "select"}


class ShellSyntaxError(Exception):
    """bash would refuse the text (exit code 2)."""


class ShellExit(Exception):
    """The shell stops with ``status`` (``exit``, ``set -e``, ``${X?}``, ``set -u``)."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


# =================================================================================== output
class Sink(Protocol):
    """Where a command writes text."""

    def write(self, text: str) -> None: ...


class NullSink:
    """``/dev/null``."""

    def write(self, text: str) -> None:
        del text


class CaptureSink:
    """Collects text (pipes, command substitution)."""

    def __init__(self) -> None:
        self.buffer = io.StringIO()

    def write(self, text: str) -> None:
        self.buffer.write(text)

    def getvalue(self) -> str:
        return self.buffer.getvalue()


class CallbackSink:
    """Forwards text to a callable (a log file, a terminal)."""

    def __init__(self, callback: Callable[[str], None]) -> None:
        self.callback = callback

    def write(self, text: str) -> None:
        if text:
            self.callback(text)


# ===================================================================================== host
CommandFn = Callable[["Shell", list[str], str, Sink, Sink, dict[str, str]], int]


class ShellHost(Protocol):
    """The machine the script runs on: its commands and its files."""

    def resolve_command(self, shell: Shell, name: str) -> CommandFn | None:
        """The implementation of ``name`` (a bare name looked up on ``$PATH`` or a path)."""

    def read_file(self, shell: Shell, path: str) -> str | None:
        """Text of ``path`` (relative to ``shell.cwd``), ``None`` if it does not exist."""

    def open_sink(self, shell: Shell, path: str, append: bool) -> Sink | None:
        """A sink writing to ``path``; ``None`` if the path cannot be written."""

    def file_test(self, shell: Shell, op: str, path: str) -> bool:
        """``test -f/-d/-e/-s/-x PATH``."""

    def is_dir(self, shell: Shell, path: str) -> bool:
        """For ``cd``."""


# =================================================================================== tokens
@dataclass(frozen=True)
class Word:
    """A word as written: parts keep their quoting for expansion."""

    parts: tuple[tuple[Any, ...], ...]
    line: int

    def literal(self) -> str | None:
        """The word's text if it is one unquoted literal (keywords, assignments)."""
        if len(self.parts) == 1 and self.parts[0][0] == "lit":
            return str(self.parts[0][1])
        return None

    def raw_text(self) -> str:
        out: list[str] = []
        for part in self.parts:
            if part[0] in ("lit", "sq", "exp"):
                out.append(str(part[1]))
            elif part[0] == "dq":
                out.append('"' + "".join(str(p[1]) for p in part[1]) + '"')
            elif part[0] == "tilde":
                out.append("~")
        return "".join(out)


@dataclass(frozen=True)
class Op:
    """An operator token (``&&``, ``|``, ``;``, ``(``, newline as ``\\n``)."""

    text: str
    line: int


@dataclass(frozen=True)
class Redir:
    """A redirection operator with its file descriptor."""

    op: str  # > >> < >& &>
    fd: int
    line: int


Token = Word | Op | Redir


def _read_balanced(text: str, start: int, opener: str, closer: str) -> int:
    """Index just past the ``closer`` that balances ``text[start]`` (== opener)."""
    depth = 0
    index = start
    while index < len(text):
        char = text[index]
        if char == "\\":
            index += 2
            continue
        if char == "'" and opener == "(":
            end = text.find("'", index + 1)
            if end < 0:
                raise ShellSyntaxError("unexpected EOF while looking for matching `''")
            index = end + 1
            continue
        if char == '"':
            index = _skip_double_quoted(text, index + 1)
            continue
        if char == opener:
            depth += 1
        elif char == closer:
            depth -= 1
            if depth == 0:
                return index + 1
        index += 1
    raise ShellSyntaxError(f"unexpected EOF while looking for matching `{closer}'")


def _skip_double_quoted(text: str, index: int) -> int:
    """Index just past the closing quote of a double-quoted string starting at ``index``."""
    while index < len(text):
        char = text[index]
        if char == "\\":
            index += 2
            continue
        if char == '"':
            return index + 1
        if char == "$" and text.startswith("$(", index):
            index = _read_balanced(text, index + 1, "(", ")")
            continue
        if char == "`":
            end = text.find("`", index + 1)
            if end < 0:
                raise ShellSyntaxError("unexpected EOF while looking for matching ``'")
            index = end + 1
            continue
        index += 1
    raise ShellSyntaxError("unexpected EOF while looking for matching `\"'")


def _read_dollar(text: str, index: int) -> tuple[str | None, int]:
    """Raw text of a ``$`` expansion starting at ``index``; ``None`` for a lone ``$``."""
    if text.startswith("$((", index):
        end = _read_balanced(text, index + 1, "(", ")")
        return text[index:end], end
    if text.startswith("$(", index):
        end = _read_balanced(text, index + 1, "(", ")")
        return text[index:end], end
    if text.startswith("${", index):
        end = _read_balanced(text, index + 1, "{", "}")
        return text[index:end], end
    nxt = text[index + 1] if index + 1 < len(text) else ""
    if nxt and nxt in "?$#@*!-0123456789":
        return text[index : index + 2], index + 2
    match = NAME_RE.match(text, index + 1)
    if match:
        return text[index : match.end()], match.end()
    return None, index + 1


def _parse_double_quoted(text: str, index: int) -> tuple[tuple[tuple[Any, ...], ...], int]:
    """Parts inside ``"..."`` starting after the opening quote."""
    parts: list[tuple[Any, ...]] = []
    buf: list[str] = []

    def flush() -> None:
        if buf:
            parts.append(("lit", "".join(buf)))
            buf.clear()

    while index < len(text):
        char = text[index]
        if char == '"':
            flush()
            return tuple(parts), index + 1
        if char == "\\" and index + 1 < len(text):
            nxt = text[index + 1]
            if nxt == "\n":
                index += 2
                continue
            if nxt in '$`"\\':
                buf.append(nxt)
                index += 2
                continue
            buf.append(char)
            index += 1
            continue
        if char == "$":
            raw, end = _read_dollar(text, index)
            if raw is None:
                buf.append("$")
            else:
                flush()
                parts.append(("exp", raw))
            index = end
            continue
        if char == "`":
            end = text.find("`", index + 1)
            if end < 0:
                raise ShellSyntaxError("unexpected EOF while looking for matching ``'")
            flush()
            parts.append(("exp", text[index : end + 1]))
            index = end + 1
            continue
        buf.append(char)
        index += 1
    raise ShellSyntaxError("unexpected EOF while looking for matching `\"'")


def tokenize(text: str) -> list[Token]:
    """Split ``text`` into words, operators and redirections."""
    tokens: list[Token] = []
    index = 0
    line = 1
    length = len(text)
    while index < length:
        char = text[index]
        if char in " \t\r":
            index += 1
            continue
        if char == "\\" and text.startswith("\\\n", index):
            index += 2
            line += 1
            continue
        if char == "\n":
            tokens.append(Op("\n", line))
            line += 1
            index += 1
            continue
        if char == "#":
            while index < length and text[index] != "\n":
                index += 1
            continue
        two = text[index : index + 2]
        if two in ("&&", "||", ";;"):
            tokens.append(Op(two, line))
            index += 2
            continue
        if two == "&>":
            tokens.append(Redir("&>", 1, line))
            index += 2
            continue
        if char in "<>":
            if text.startswith("<<", index):
                raise ShellSyntaxError("here-documents are not supported by the sandbox shell")
            op, index = _read_redirect_op(text, index)
            tokens.append(Redir(op, 0 if op == "<" else 1, line))
            continue
        if char in ";&|()":
            tokens.append(Op(char, line))
            index += 1
            continue
        word, index, line = _read_word(text, index, line)
        # ``2>file`` / ``2>&1``: digits glued to a redirection are a file descriptor.
        literal = word.literal()
        if literal is not None and literal.isdigit() and index < length and text[index] in "<>":
            op, index = _read_redirect_op(text, index)
            tokens.append(Redir(op, int(literal), line))
            continue
        tokens.append(word)
    return tokens


def _read_redirect_op(text: str, index: int) -> tuple[str, int]:
    if text.startswith(">>", index):
        return ">>", index + 2
    if text.startswith(">&", index):
        return ">&", index + 2
    if text.startswith("<&", index):
        return "<&", index + 2
    return text[index], index + 1


def _read_word(text: str, index: int, line: int) -> tuple[Word, int, int]:
    parts: list[tuple[Any, ...]] = []
    buf: list[str] = []
    start_line = line

    def flush() -> None:
        if buf:
            parts.append(("lit", "".join(buf)))
            buf.clear()

    if text[index] == "~" and (index + 1 == len(text) or text[index + 1] in "/ \t\n;&|)"):
        parts.append(("tilde",))
        index += 1
    while index < len(text):
        char = text[index]
        if char in " \t\r\n" or char in OPERATOR_CHARS:
            break
        if char == "\\":
            if index + 1 < len(text):
                nxt = text[index + 1]
                if nxt == "\n":
                    index += 2
                    line += 1
                    continue
                flush()
                parts.append(("sq", nxt))
                index += 2
                continue
            index += 1
            continue
        if char == "'":
            end = text.find("'", index + 1)
            if end < 0:
                raise ShellSyntaxError("unexpected EOF while looking for matching `''")
            flush()
            parts.append(("sq", text[index + 1 : end]))
            line += text.count("\n", index, end)
            index = end + 1
            continue
        if char == '"':
            flush()
            inner, end = _parse_double_quoted(text, index + 1)
            parts.append(("dq", inner))
            line += text.count("\n", index, end)
            index = end
            continue
        if char == "$":
            raw, end = _read_dollar(text, index)
            if raw is None:
                buf.append("$")
            else:
                flush()
                parts.append(("exp", raw))
                line += raw.count("\n")
            index = end
            continue
        if char == "`":
            end = text.find("`", index + 1)
            if end < 0:
                raise ShellSyntaxError("unexpected EOF while looking for matching ``'")
            flush()
            parts.append(("exp", text[index : end + 1]))
            index = end + 1
            continue
        buf.append(char)
        index += 1
    flush()
    return Word(tuple(parts), start_line), index, line


# ====================================================================================== AST
@dataclass
class SimpleCommand:
    """``A=1 cmd arg >file``."""

    assigns: list[tuple[str, Word]]
    words: list[Word]
    redirs: list[tuple[Redir, Word]]
    line: int


@dataclass
class Compound:
    """``( list )`` (subshell) or ``{ list; }`` (group)."""

    body: ListNode
    subshell: bool
    redirs: list[tuple[Redir, Word]] = field(default_factory=list)
    line: int = 0


@dataclass
class IfNode:
    """``if c; then a; elif c2; then b; else d; fi``."""

    branches: list[tuple[ListNode, ListNode]]
    orelse: ListNode | None
    redirs: list[tuple[Redir, Word]] = field(default_factory=list)
    line: int = 0


Command = SimpleCommand | Compound | IfNode


@dataclass
class Pipeline:
    commands: list[Command]
    negate: bool = False


@dataclass
class AndOr:
    pipelines: list[Pipeline]
    ops: list[str]


@dataclass
class ListNode:
    items: list[AndOr]


class Parser:
    """Recursive-descent parser over :func:`tokenize` output."""

    def __init__(self, tokens: Sequence[Token]) -> None:
        self.tokens = list(tokens)
        self.pos = 0

    def peek(self) -> Token | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def peek_keyword(self) -> str | None:
        token = self.peek()
        if isinstance(token, Word):
            literal = token.literal()
            if literal in RESERVED:
                return literal
        return None

    def advance(self) -> Token:
        token = self.tokens[self.pos]
        self.pos += 1
        return token

    def skip_newlines(self) -> None:
        while isinstance(self.peek(), Op) and self.peek().text in ("\n",):  # type: ignore[union-attr]
            self.pos += 1

    def unexpected(self, token: Token | None) -> ShellSyntaxError:
        if token is None:
            return ShellSyntaxError("syntax error: unexpected end of file")
        text = (
            token.text
            if isinstance(token, Op)
            else (token.op if isinstance(token, Redir) else token.raw_text())
        )
        text = "newline" if text == "\n" else text
        return ShellSyntaxError(f"syntax error near unexpected token `{text}'")

    def parse_script(self) -> ListNode:
        node = self.parse_list(set())
        if self.peek() is not None:
            raise self.unexpected(self.peek())
        return node

    def parse_list(self, terminators: set[str]) -> ListNode:
        items: list[AndOr] = []
        while True:
            self.skip_newlines()
            token = self.peek()
            if token is None:
                break
            if isinstance(token, Op) and token.text in (")",) and ")" in terminators:
                break
            keyword = self.peek_keyword()
            if keyword is not None and keyword in terminators:
                break
            items.append(self.parse_and_or())
            token = self.peek()
            if isinstance(token, Op) and token.text in (";", "\n", "&"):
                self.pos += 1
                continue
            if token is None:
                break
            if isinstance(token, Op) and token.text == ")" and ")" in terminators:
                break
            keyword = self.peek_keyword()
            if keyword is not None and keyword in terminators:
                break
            raise self.unexpected(token)
        return ListNode(items)

    def parse_and_or(self) -> AndOr:
        pipelines = [self.parse_pipeline()]
        ops: list[str] = []
        while isinstance(self.peek(), Op) and self.peek().text in ("&&", "||"):  # type: ignore[union-attr]
            ops.append(self.advance().text)  # type: ignore[union-attr]
            self.skip_newlines()
            pipelines.append(self.parse_pipeline())
        return AndOr(pipelines, ops)

    def parse_pipeline(self) -> Pipeline:
        negate = False
        if self.peek_keyword() == "!":
            self.pos += 1
            negate = True
        commands = [self.parse_command()]
        while isinstance(self.peek(), Op) and self.peek().text == "|":  # type: ignore[union-attr]
            self.pos += 1
            self.skip_newlines()
            commands.append(self.parse_command())
        return Pipeline(commands, negate)

    def parse_redirs(self) -> list[tuple[Redir, Word]]:
        redirs: list[tuple[Redir, Word]] = []
        while isinstance(self.peek(), Redir):
            redir = self.advance()
            target = self.peek()
            if not isinstance(target, Word):
                raise self.unexpected(target)
            self.pos += 1
            redirs.append((redir, target))  # type: ignore[arg-type]
        return redirs

    def parse_command(self) -> Command:
        token = self.peek()
        if token is None:
            raise self.unexpected(None)
        if isinstance(token, Op) and token.text == "(":
            self.pos += 1
            body = self.parse_list({")"})
            closing = self.peek()
            if not (isinstance(closing, Op) and closing.text == ")"):
                raise self.unexpected(closing)
            self.pos += 1
            return Compound(body, True, self.parse_redirs(), token.line)
        keyword = self.peek_keyword()
        if keyword == "{":
            self.pos += 1
            body = self.parse_list({"}"})
            if self.peek_keyword() != "}":
                raise self.unexpected(self.peek())
            self.pos += 1
            return Compound(body, False, self.parse_redirs(), getattr(token, "line", 0))
        if keyword == "if":
            return self.parse_if()
        if keyword in UNSUPPORTED_KEYWORDS:
            raise ShellSyntaxError(f"`{keyword}' is not supported by the sandbox shell")
        if keyword in ("then", "elif", "else", "fi", "}"):
            raise self.unexpected(token)
        return self.parse_simple()

    def parse_if(self) -> IfNode:
        line = self.advance().line  # type: ignore[union-attr]
        branches: list[tuple[ListNode, ListNode]] = []
        orelse: ListNode | None = None
        while True:
            condition = self.parse_list({"then"})
            if self.peek_keyword() != "then":
                raise self.unexpected(self.peek())
            self.pos += 1
            body = self.parse_list({"elif", "else", "fi"})
            branches.append((condition, body))
            keyword = self.peek_keyword()
            if keyword == "elif":
                self.pos += 1
                continue
            if keyword == "else":
                self.pos += 1
                orelse = self.parse_list({"fi"})
                keyword = self.peek_keyword()
            if keyword != "fi":
                raise self.unexpected(self.peek())
            self.pos += 1
            return IfNode(branches, orelse, self.parse_redirs(), line)

    def parse_simple(self) -> SimpleCommand:
        assigns: list[tuple[str, Word]] = []
        words: list[Word] = []
        redirs: list[tuple[Redir, Word]] = []
        line = 0
        while True:
            token = self.peek()
            if isinstance(token, Redir):
                redirs.extend(self.parse_redirs())
                continue
            if not isinstance(token, Word):
                break
            if not line:
                line = token.line
            if not words:
                first = token.parts[0] if token.parts else None
                if first and first[0] == "lit":
                    match = ASSIGN_RE.match(str(first[1]))
                    if match:
                        rest_text = str(first[1])[match.end() :]
                        rest_parts = ((("lit", rest_text),) if rest_text else ()) + token.parts[1:]
                        assigns.append((match.group(1), Word(rest_parts, token.line)))
                        self.pos += 1
                        continue
            words.append(token)
            self.pos += 1
        if not assigns and not words and not redirs:
            raise self.unexpected(self.peek())
        return SimpleCommand(assigns, words, redirs, line)


def parse(text: str) -> ListNode:
    """Parse a script or a ``bash -c`` string."""
    return Parser(tokenize(text)).parse_script()


# =============================================================================== arithmetic
_ARITH_BINOPS: dict[type, Callable[[int, int], int]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Mod: lambda a, b: int(a - b * int(a / b)),
    ast.Div: lambda a, b: int(a / b),
    ast.FloorDiv: lambda a, b: int(a / b),
}


def arithmetic(expr: str, lookup: Callable[[str], str]) -> int:
    """Evaluate ``$(( expr ))`` (integers, + - * / %, comparisons, variables)."""
    text = expr.replace("&&", " and ").replace("||", " or ")
    text = re.sub(r"!(?!=)", " not ", text)
    try:
        tree = ast.parse(text.strip() or "0", mode="eval")
    except SyntaxError:
        raise ShellSyntaxError(f"{expr}: syntax error in expression") from None

    def value(node: ast.AST) -> int:
        if isinstance(node, ast.Expression):
            return value(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return int(node.value)
        if isinstance(node, ast.Name):
            raw = lookup(node.id).strip() or "0"
            return arithmetic(raw, lookup) if not raw.lstrip("-").isdigit() else int(raw)
        if isinstance(node, ast.BinOp) and type(node.op) in _ARITH_BINOPS:
            right = value(node.right)
            if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
                raise ShellSyntaxError(f"{expr}: division by 0")
            return _ARITH_BINOPS[type(node.op)](value(node.left), right)
        if isinstance(node, ast.UnaryOp):
            operand = value(node.operand)
            if isinstance(node.op, ast.USub):
                return -operand
            if isinstance(node.op, ast.UAdd):
                return operand
            if isinstance(node.op, ast.Not):
                return int(not operand)
        if isinstance(node, ast.Compare) and len(node.ops) == 1:
            left, right = value(node.left), value(node.comparators[0])
            compare = {
                ast.Lt: operator.lt,
                ast.LtE: operator.le,
                ast.Gt: operator.gt,
                ast.GtE: operator.ge,
                ast.Eq: operator.eq,
                ast.NotEq: operator.ne,
            }.get(type(node.ops[0]))
            if compare is not None:
                return int(compare(left, right))
        if isinstance(node, ast.BoolOp):
            results = [value(v) for v in node.values]
            return int(all(results) if isinstance(node.op, ast.And) else any(results))
        raise ShellSyntaxError(f"{expr}: unsupported arithmetic")

    return value(tree)


# ============================================================================== interpreter
@dataclass
class ShellOptions:
    errexit: bool = False
    nounset: bool = False
    pipefail: bool = False
    xtrace: bool = False


class Shell:
    """One bash process: variables, options, working directory."""

    def __init__(
        self,
        host: ShellHost,
        env: dict[str, str],
        cwd: str,
        out: Sink,
        err: Sink,
        name: str = "bash",
    ) -> None:
        self.host = host
        self.vars: dict[str, str] = dict(env)
        self.exported: set[str] = set(env)
        self.cwd = cwd
        self.out = out
        self.err = err
        self.name = name
        self.opts = ShellOptions()
        self.last_status = 0
        self._cond_depth = 0
        self._line = 0
        self.last_sub_status: int | None = None

    # -- public ---------------------------------------------------------------------------
    def run(self, text: str, stdin: str = "") -> int:
        """Run ``text``; returns the exit status like ``bash -c`` would."""
        try:
            tree = parse(text)
        except ShellSyntaxError as error:
            self.err.write(f"{self.name}: line {self._line or 1}: {error}\n")
            return 2
        try:
            status = self.exec_list(tree, stdin, self.out, self.err)
        except ShellExit as stop:
            status = stop.status
        except ShellSyntaxError as error:
            self.err.write(f"{self.name}: line {self._line or 1}: {error}\n")
            status = 1
        self.last_status = status
        return status

    def exported_env(self) -> dict[str, str]:
        return {k: v for k, v in self.vars.items() if k in self.exported}

    def child(self, out: Sink | None = None, err: Sink | None = None) -> Shell:
        """A subshell: copies variables and options."""
        sub = Shell(self.host, {}, self.cwd, out or self.out, err or self.err, self.name)
        sub.vars = dict(self.vars)
        sub.exported = set(self.exported)
        sub.opts = ShellOptions(**vars(self.opts))
        sub.last_status = self.last_status
        sub._line = self._line
        return sub

    def error(self, message: str) -> None:
        """Print ``bash: line N: message`` to stderr."""
        self.err.write(f"{self.name}: line {self._line or 1}: {message}\n")

    # -- execution ------------------------------------------------------------------------
    def exec_list(self, node: ListNode, stdin: str, out: Sink, err: Sink) -> int:
        status = 0
        for item in node.items:
            status = self.exec_and_or(item, stdin, out, err)
        return status

    def exec_and_or(self, node: AndOr, stdin: str, out: Sink, err: Sink) -> int:
        status = 0
        last = len(node.pipelines) - 1
        ran_last = False
        for index, pipeline in enumerate(node.pipelines):
            if index > 0:
                op = node.ops[index - 1]
                if (op == "&&" and status != 0) or (op == "||" and status == 0):
                    continue
            guarded = index < last
            if guarded:
                self._cond_depth += 1
            try:
                status = self.exec_pipeline(pipeline, stdin, out, err)
            finally:
                if guarded:
                    self._cond_depth -= 1
            ran_last = index == last
            self.last_status = status
        if status != 0 and ran_last and self.opts.errexit and self._cond_depth == 0:
            raise ShellExit(status)
        return status

    def exec_pipeline(self, node: Pipeline, stdin: str, out: Sink, err: Sink) -> int:
        if node.negate:
            self._cond_depth += 1
        try:
            statuses: list[int] = []
            data = stdin
            for index, command in enumerate(node.commands):
                is_last = index == len(node.commands) - 1
                if is_last:
                    statuses.append(
                        self.exec_command(command, data, out, err, in_pipeline=len(node.commands) > 1)
                    )
                else:
                    capture = CaptureSink()
                    statuses.append(self.exec_command(command, data, capture, err, in_pipeline=True))
                    data = capture.getvalue()
        finally:
            if node.negate:
                self._cond_depth -= 1
        status = statuses[-1]
        if self.opts.pipefail:
            status = next((s for s in reversed(statuses) if s != 0), 0)
        if node.negate:
            return 0 if status else 1
        return status

    def exec_command(self, node: Command, stdin: str, out: Sink, err: Sink, in_pipeline: bool) -> int:
        if isinstance(node, SimpleCommand):
            self._line = node.line or self._line
            if in_pipeline:
                # Each part of a pipeline runs in a subshell.
                sub = self.child()
                try:
                    return sub.exec_simple(node, stdin, out, err)
                except ShellExit as stop:
                    return stop.status
            return self.exec_simple(node, stdin, out, err)
        redirected = self._apply_redirs(node.redirs, stdin, out, err)
        if redirected is None:
            return 1
        stdin, out, err, closers = redirected
        try:
            if isinstance(node, Compound):
                if node.subshell or in_pipeline:
                    sub = self.child()
                    sub._cond_depth = self._cond_depth
                    try:
                        return sub.exec_list(node.body, stdin, out, err)
                    except ShellExit as stop:
                        return stop.status
                return self.exec_list(node.body, stdin, out, err)
            return self.exec_if(node, stdin, out, err)
        finally:
            for closer in closers:
                closer()

    def exec_if(self, node: IfNode, stdin: str, out: Sink, err: Sink) -> int:
        for condition, body in node.branches:
            self._cond_depth += 1
            try:
                status = self.exec_list(condition, stdin, out, err)
            finally:
                self._cond_depth -= 1
            if status == 0:
                return self.exec_list(body, stdin, out, err)
        if node.orelse is not None:
            return self.exec_list(node.orelse, stdin, out, err)
        return 0

    def exec_simple(self, node: SimpleCommand, stdin: str, out: Sink, err: Sink) -> int:
        self.last_sub_status = None
        assignments = [(name, self.expand_assignment(word)) for name, word in node.assigns]
        argv: list[str] = []
        declaration = bool(node.words) and node.words[0].literal() in (
            "export",
            "readonly",
            "local",
            "declare",
        )
        for position, word in enumerate(node.words):
            first = word.parts[0] if word.parts else None
            if (
                declaration
                and position > 0
                and first is not None
                and first[0] == "lit"
                and ASSIGN_RE.match(str(first[1]))
            ):
                # Declaration builtins take ``NAME=value`` without word splitting.
                argv.append(self.expand_assignment(word))
            else:
                argv.extend(self.expand_word(word))
        redirected = self._apply_redirs(node.redirs, stdin, out, err)
        if redirected is None:
            return 1
        stdin, out, err, closers = redirected
        try:
            if not argv:
                for name, value in assignments:
                    self.vars[name] = value
                status = self.last_sub_status if self.last_sub_status is not None else 0
                return self._maybe_errexit(status)
            if self.opts.xtrace:
                err.write("+ " + " ".join(argv) + "\n")
            builtin = BUILTINS.get(argv[0])
            if builtin is not None:
                saved = {name: self.vars.get(name) for name, _ in assignments}
                for name, value in assignments:
                    self.vars[name] = value
                try:
                    status = builtin(self, argv, stdin, out, err)
                finally:
                    if argv[0] not in ("export", "source", "."):
                        for name, old in saved.items():
                            if old is None:
                                self.vars.pop(name, None)
                            else:
                                self.vars[name] = old
                return self._maybe_errexit(status)
            command = self.host.resolve_command(self, argv[0])
            if command is None:
                self.error(f"{argv[0]}: command not found")
                return self._maybe_errexit(127)
            env = self.exported_env()
            env.update(assignments)
            status = command(self, argv, stdin, out, err, env)
            return self._maybe_errexit(status)
        finally:
            for closer in closers:
                closer()

    def _maybe_errexit(self, status: int) -> int:
        # ``set -e`` is applied by exec_and_or for the last element of an and-or list.
        self.last_status = status
        return status

    def _apply_redirs(
        self, redirs: Sequence[tuple[Redir, Word]], stdin: str, out: Sink, err: Sink
    ) -> tuple[str, Sink, Sink, list[Callable[[], None]]] | None:
        closers: list[Callable[[], None]] = []
        for redir, target_word in redirs:
            targets = self.expand_word(target_word)
            target = " ".join(targets)
            if redir.op == ">&" or redir.op == "<&":
                if target in ("1", "2"):
                    if redir.fd == 2 and target == "1":
                        err = out
                    elif redir.fd == 1 and target == "2":
                        out = err
                    continue
                if target == "-":
                    continue
            if redir.op == "<":
                content = self.host.read_file(self, target)
                if content is None:
                    self.error(f"{target}: No such file or directory")
                    return None
                stdin = content
                continue
            if target == "/dev/null":
                sink: Sink = NullSink()
            elif target in ("/dev/stderr",):
                sink = err
            elif target in ("/dev/stdout",):
                sink = out
            else:
                opened = self.host.open_sink(self, target, append=redir.op == ">>")
                if opened is None:
                    self.error(f"{target}: No such file or directory")
                    return None
                sink = opened
                close = getattr(opened, "close", None)
                if callable(close):
                    closers.append(close)
            if redir.op == "&>":
                out = err = sink
            elif redir.fd == 2:
                err = sink
            else:
                out = sink
        return stdin, out, err, closers

    # -- expansion ------------------------------------------------------------------------
    def lookup(self, name: str) -> str | None:
        if name == "?":
            return str(self.last_status)
        if name == "$":
            return "4242"
        if name in ("#",):
            return "0"
        if name in ("@", "*", "-", "!"):
            return ""
        if name == "0":
            return self.name
        if name.isdigit():
            return None
        return self.vars.get(name)

    def _unbound(self, name: str) -> str:
        if self.opts.nounset and name not in ("@", "*") and not name.isdigit():
            self.error(f"{name}: unbound variable")
            raise ShellExit(1)
        return ""

    def expand_assignment(self, word: Word) -> str:
        return "".join(self._expand_parts(word.parts, split=False)[0] or [""])

    def expand_word(self, word: Word) -> list[str]:
        fields, _ = self._expand_parts(word.parts, split=True)
        return fields

    def _expand_parts(self, parts: Sequence[tuple[Any, ...]], split: bool) -> tuple[list[str], bool]:
        fields: list[str] = []
        current: list[str] = []
        quoted = False
        has_current = False
        for part in parts:
            kind = part[0]
            if kind == "lit":
                current.append(str(part[1]))
                has_current = True
            elif kind == "sq":
                current.append(str(part[1]))
                has_current = True
                quoted = True
            elif kind == "tilde":
                current.append(self.vars.get("HOME", "~"))
                has_current = True
            elif kind == "dq":
                current.append(self._expand_dq(part[1]))
                has_current = True
                quoted = True
            elif kind == "exp":
                value = self.expand_dollar(str(part[1]))
                if not split:
                    current.append(value)
                    has_current = True
                    continue
                if not value:
                    continue
                pieces = value.split()
                if value[0].isspace() and has_current:
                    fields.append("".join(current))
                    current, has_current = [], False
                for position, piece in enumerate(pieces):
                    if position > 0:
                        fields.append("".join(current))
                        current = []
                    current.append(piece)
                    has_current = True
                if value[-1].isspace() and has_current:
                    fields.append("".join(current))
                    current, has_current = [], False
        if has_current and ("".join(current) or quoted):
            fields.append("".join(current))
        if not split:
            return ["".join(fields)], quoted
        return fields, quoted

    def _expand_dq(self, parts: Sequence[tuple[Any, ...]]) -> str:
        out: list[str] = []
        for part in parts:
            out.append(str(part[1]) if part[0] == "lit" else self.expand_dollar(str(part[1])))
        return "".join(out)

    def _expand_text(self, text: str) -> str:
        """Expand ``$`` references inside an operand such as the ``x`` of ``${A:-x}``."""
        if not text:
            return ""
        parts, end = _parse_double_quoted(text + '"', 0)
        del end
        return self._expand_dq(parts)

    def command_substitution(self, script: str) -> str:
        capture = CaptureSink()
        sub = self.child(out=capture)
        sub._cond_depth = 0
        status = sub.run(script)
        self.last_sub_status = status
        self.last_status = status
        return capture.getvalue().rstrip("\n")

    def expand_dollar(self, raw: str) -> str:
        if raw.startswith("`"):
            return self.command_substitution(raw[1:-1])
        if raw.startswith("$(("):
            inner = raw[3:-2]
            expanded = self._expand_text(inner)
            return str(arithmetic(expanded, lambda name: self.vars.get(name, "")))
        if raw.startswith("$("):
            return self.command_substitution(raw[2:-1])
        if raw.startswith("${"):
            return self._parameter(raw[2:-1])
        name = raw[1:]
        value = self.lookup(name)
        return self._unbound(name) if value is None else value

    def _parameter(self, body: str) -> str:
        if body.startswith("#") and len(body) > 1:
            value = self.lookup(body[1:])
            return str(len(value or ""))
        match = re.match(r"([A-Za-z_][A-Za-z0-9_]*|[0-9]+|[?$#@*!-])", body)
        if not match:
            raise ShellSyntaxError(f"${{{body}}}: bad substitution")
        name = match.group(1)
        rest = body[match.end() :]
        value = self.lookup(name)
        if not rest:
            return self._unbound(name) if value is None else value
        for op in (":-", ":=", ":?", ":+", "-", "=", "?", "+", "%%", "%", "##", "#"):
            if rest.startswith(op):
                operand = rest[len(op) :]
                break
        else:
            raise ShellSyntaxError(f"${{{body}}}: bad substitution")
        null_counts = op.startswith(":")
        missing = value is None or (null_counts and value == "")
        if op in (":-", "-"):
            return self._expand_text(operand) if missing else str(value)
        if op in (":=", "="):
            if missing:
                self.vars[name] = self._expand_text(operand)
            return self.vars.get(name, "")
        if op in (":+", "+"):
            return "" if missing else self._expand_text(operand)
        if op in (":?", "?"):
            if missing:
                message = self._expand_text(operand) or (
                    "parameter null or not set" if null_counts else "parameter not set"
                )
                self.error(f"{name}: {message}")
                raise ShellExit(1)
            return str(value)
        if value is None:
            return self._unbound(name)
        regex = _glob_to_regex(self._expand_text(operand))
        size = len(value)
        if op == "%":
            starts: Sequence[int] = range(size, -1, -1)
        elif op == "%%" or op == "#":
            starts = range(size + 1)
        else:
            starts = range(size, -1, -1)
        for cut in starts:
            if op in ("%", "%%") and re.fullmatch(regex, value[cut:]):
                return value[:cut]
            if op in ("#", "##") and re.fullmatch(regex, value[:cut]):
                return value[cut:]
        return value


def _glob_to_regex(pattern: str) -> str:
    out: list[str] = []
    for char in pattern:
        if char == "*":
            out.append(".*")
        elif char == "?":
            out.append(".")
        else:
            out.append(re.escape(char))
    return "".join(out)


# ================================================================================= builtins
BuiltinFn = Callable[[Shell, list[str], str, Sink, Sink], int]


def _b_true(shell: Shell, argv: list[str], stdin: str, out: Sink, err: Sink) -> int:
    return 0


def _b_false(shell: Shell, argv: list[str], stdin: str, out: Sink, err: Sink) -> int:
    return 1


def _b_echo(shell: Shell, argv: list[str], stdin: str, out: Sink, err: Sink) -> int:
    args = argv[1:]
    newline = True
    interpret = False
    while args and re.fullmatch(r"-[neE]+", args[0]):
        newline = newline and "n" not in args[0]
        interpret = "e" in args[0]
        args = args[1:]
    text = " ".join(args)
    if interpret:
        text = text.replace("\\n", "\n").replace("\\t", "\t")
    out.write(text + ("\n" if newline else ""))
    return 0


def _b_printf(shell: Shell, argv: list[str], stdin: str, out: Sink, err: Sink) -> int:
    if len(argv) < 2:
        err.write("printf: usage: printf [-v var] format [arguments]\n")
        return 2
    fmt = argv[1].replace("\\n", "\n").replace("\\t", "\t")
    args = argv[2:]
    count = fmt.count("%s") + fmt.count("%d")
    if count == 0:
        out.write(fmt)
        return 0
    while True:
        chunk, args = args[:count], args[count:]
        chunk += [""] * (count - len(chunk))
        text = fmt
        for value in chunk:
            text = re.sub(r"%[sd]", value.replace("\\", "\\\\"), text, count=1)
        out.write(text)
        if not args:
            return 0


def _b_export(shell: Shell, argv: list[str], stdin: str, out: Sink, err: Sink) -> int:
    status = 0
    for arg in argv[1:]:
        if arg in ("-p", "-n"):
            continue
        name, sep, value = arg.partition("=")
        if not NAME_RE.fullmatch(name):
            shell.error(f"export: `{arg}': not a valid identifier")
            status = 1
            continue
        if sep:
            shell.vars[name] = value
        shell.exported.add(name)
    return status


def _b_unset(shell: Shell, argv: list[str], stdin: str, out: Sink, err: Sink) -> int:
    for name in argv[1:]:
        if name in ("-v", "-f"):
            continue
        shell.vars.pop(name, None)
        shell.exported.discard(name)
    return 0


def _b_set(shell: Shell, argv: list[str], stdin: str, out: Sink, err: Sink) -> int:
    args = argv[1:]
    index = 0
    letters = {"e": "errexit", "u": "nounset", "x": "xtrace"}
    while index < len(args):
        arg = args[index]
        index += 1
        if arg in ("-o", "+o"):
            if index >= len(args):
                return 0
            option = args[index]
            index += 1
            if option not in ("errexit", "nounset", "pipefail", "xtrace"):
                shell.error(f"set: {option}: invalid option name")
                return 2
            setattr(shell.opts, option, arg == "-o")
            continue
        if arg and arg[0] in "-+" and len(arg) > 1:
            enable = arg[0] == "-"
            for letter in arg[1:]:
                if letter == "o":
                    if index < len(args):
                        option = args[index]
                        index += 1
                        if option not in ("errexit", "nounset", "pipefail", "xtrace"):
                            shell.error(f"set: {option}: invalid option name")
                            return 2
                        setattr(shell.opts, option, enable)
                    continue
                if letter in letters:
                    setattr(shell.opts, letters[letter], enable)
                elif letter not in "vhBHmCfabknPT":
                    shell.error(f"set: -{letter}: invalid option")
                    return 2
            continue
    return 0


def _b_cd(shell: Shell, argv: list[str], stdin: str, out: Sink, err: Sink) -> int:
    target = argv[1] if len(argv) > 1 else shell.vars.get("HOME", "/")
    path = target if target.startswith("/") else _join(shell.cwd, target)
    if not shell.host.is_dir(shell, path):
        shell.error(f"cd: {target}: No such file or directory")
        return 1
    shell.cwd = _normalize(path)
    shell.vars["PWD"] = shell.cwd
    return 0


def _b_pwd(shell: Shell, argv: list[str], stdin: str, out: Sink, err: Sink) -> int:
    out.write(shell.cwd + "\n")
    return 0


def _b_source(shell: Shell, argv: list[str], stdin: str, out: Sink, err: Sink) -> int:
    if len(argv) < 2:
        shell.error(f"{argv[0]}: filename argument required")
        return 2
    text = shell.host.read_file(shell, argv[1])
    if text is None:
        shell.error(f"{argv[1]}: No such file or directory")
        return 1
    try:
        tree = parse(text)
    except ShellSyntaxError as error:
        shell.error(f"{argv[1]}: {error}")
        return 2
    return shell.exec_list(tree, stdin, out, err)


def _b_exit(shell: Shell, argv: list[str], stdin: str, out: Sink, err: Sink) -> int:
    code = shell.last_status
    if len(argv) > 1:
        try:
            code = int(argv[1]) & 0xFF
        except ValueError:
            shell.error(f"exit: {argv[1]}: numeric argument required")
            code = 2
    raise ShellExit(code)


def _b_test(shell: Shell, argv: list[str], stdin: str, out: Sink, err: Sink) -> int:
    args = argv[1:]
    if argv[0] == "[":
        if not args or args[-1] != "]":
            shell.error("[: missing `]'")
            return 2
        args = args[:-1]
    elif argv[0] == "[[":
        if not args or args[-1] != "]]":
            shell.error("syntax error in conditional expression")
            return 2
        args = args[:-1]
    try:
        return 0 if _evaluate_test(shell, args) else 1
    except ValueError as error:
        shell.error(f"{argv[0]}: {error}")
        return 2


def _evaluate_test(shell: Shell, args: list[str]) -> bool:
    if not args:
        return False
    if args[0] == "!":
        return not _evaluate_test(shell, args[1:])
    if "-a" in args:
        cut = args.index("-a")
        return _evaluate_test(shell, args[:cut]) and _evaluate_test(shell, args[cut + 1 :])
    if "-o" in args:
        cut = args.index("-o")
        return _evaluate_test(shell, args[:cut]) or _evaluate_test(shell, args[cut + 1 :])
    if len(args) == 1:
        return args[0] != ""
    if len(args) == 2:
        op, operand = args
        if op == "-z":
            return operand == ""
        if op == "-n":
            return operand != ""
        if op in ("-f", "-d", "-e", "-s", "-x", "-r", "-w"):
            path = operand if operand.startswith("/") else _join(shell.cwd, operand)
            return shell.host.file_test(shell, op, path)
        raise ValueError(f"{op}: unary operator expected")
    if len(args) == 3:
        left, op, right = args
        if op in ("=", "=="):
            return left == right
        if op == "!=":
            return left != right
        numeric = {
            "-eq": operator.eq,
            "-ne": operator.ne,
            "-lt": operator.lt,
            "-le": operator.le,
            "-gt": operator.gt,
            "-ge": operator.ge,
        }
        if op in numeric:
            try:
                return bool(numeric[op](int(left), int(right)))
            except ValueError:
                raise ValueError(f"{left}: integer expression expected") from None
        raise ValueError(f"{op}: binary operator expected")
    raise ValueError("too many arguments")


def _b_command(shell: Shell, argv: list[str], stdin: str, out: Sink, err: Sink) -> int:
    if len(argv) >= 3 and argv[1] in ("-v", "-V"):
        name = argv[2]
        if name in BUILTINS:
            out.write(name + "\n")
            return 0
        if shell.host.resolve_command(shell, name) is not None:
            out.write(name + "\n")
            return 0
        return 1
    if len(argv) >= 2:
        command = shell.host.resolve_command(shell, argv[1])
        if command is None:
            shell.error(f"{argv[1]}: command not found")
            return 127
        return command(shell, argv[1:], stdin, out, err, shell.exported_env())
    return 0


BUILTINS: dict[str, BuiltinFn] = {
    ":": _b_true,
    "true": _b_true,
    "false": _b_false,
    "echo": _b_echo,
    "printf": _b_printf,
    "export": _b_export,
    "readonly": _b_export,
    "unset": _b_unset,
    "set": _b_set,
    "cd": _b_cd,
    "pwd": _b_pwd,
    "source": _b_source,
    ".": _b_source,
    "exit": _b_exit,
    "test": _b_test,
    "[": _b_test,
    "[[": _b_test,
    "command": _b_command,
    "wait": _b_true,
    "trap": _b_true,
    "umask": _b_true,
    "ulimit": _b_true,
    "hash": _b_true,
}


# ==================================================================================== paths
def _join(base: str, path: str) -> str:
    return _normalize(base.rstrip("/") + "/" + path)


def _normalize(path: str) -> str:
    parts: list[str] = []
    for piece in path.split("/"):
        if piece in ("", "."):
            continue
        if piece == "..":
            if parts:
                parts.pop()
            continue
        parts.append(piece)
    return "/" + "/".join(parts)


def absolute(shell: Shell, path: str) -> str:
    """``path`` made absolute against the shell's working directory."""
    return _normalize(path) if path.startswith("/") else _join(shell.cwd, path)
