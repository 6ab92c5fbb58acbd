"""The lexical scan of jq programs: which forbidden builtins a rule would call, and its comments.

A rule may not reach outside its envelope (environment, other inputs, stderr, files, the
process). `find_forbidden` follows jq 1.8's lexer closely enough to see calls (string literals
and comments skipped, interpolations read as code, fields and object keys not calls);
`without_comments` blanks each `#` comment so an expression can be embedded in a larger
program. Pure; each expression's scan is remembered, as stored rules are re-read per delivery.
"""

from __future__ import annotations

import re
from functools import lru_cache

SCAN_CACHE_SIZE = 1024  # expressions whose scan is remembered

# jq builtins that reach outside the envelope (environment, other inputs, stderr, files,
# the process): refused wherever they would be called.
FORBIDDEN_FUNCTIONS = frozenset({
    "env", "input", "inputs", "input_filename", "debug", "stderr", "halt", "halt_error",
    "import", "include",
})
# Refused as `$NAME` (`$ENV`, `$__loc__`); `__loc__` is refused even without the `$`.
FORBIDDEN_VARIABLES = frozenset({"ENV", "__loc__"})

_IDENT = re.compile(r"(?:[a-zA-Z_][a-zA-Z_0-9]*::)*[a-zA-Z_][a-zA-Z_0-9]*")
_NUMBER = re.compile(r"[0-9.]+(?:[eE][+-]?[0-9]+)?")
_FORMAT = re.compile(r"@[a-zA-Z0-9_]+")
_FIELD = re.compile(r"[a-zA-Z_][a-zA-Z_0-9]*")


def find_forbidden(expr: str) -> str | None:
    """The first forbidden function or variable the jq expression would use (`env`, `$ENV`, …),
    else None. Mirrors jq 1.8's lexer: string literals and comments are skipped but string
    interpolations are code; `.env` (a field) and `{env: …}` (an object key) are not calls."""
    return _scan(expr)[0]


def without_comments(expr: str) -> str:
    """The expression with each `#` comment blanked out (as jq 1.8 reads comments), so that it
    can be embedded in a larger program without a trailing comment swallowing what follows."""
    pieces, last = [], 0
    for start, end in _scan(expr)[1]:
        pieces.append(expr[last:start])
        pieces.append(" ")
        last = end
    pieces.append(expr[last:])
    return "".join(pieces)


@lru_cache(maxsize=SCAN_CACHE_SIZE)
def _scan(expr: str) -> tuple[str | None, tuple[tuple[int, int], ...]]:
    """(first forbidden name, comment spans); remembered, as stored rules are re-read per delivery."""
    scanner = _Scanner(expr)
    found = scanner.run()
    return found, tuple(scanner.comments)


class _Scanner:
    """A tokenizer that follows jq 1.8's lexer (flex longest match) closely enough to see calls."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.stack: list[str] = []  # open brackets: "(", "[", "{", or "\\(" for an interpolation
        self.prev = ""  # the kind of the previous significant token
        self.found: list[str] = []  # forbidden names, in order of appearance
        self.comments: list[tuple[int, int]] = []  # (start, end) of each comment

    def run(self) -> str | None:
        """Scans the whole text; the first forbidden name, if any."""
        while self.pos < len(self.text):
            self._token()
        return self.found[0] if self.found else None

    def _token(self) -> None:
        text, pos = self.text, self.pos
        char = text[pos]
        if char in " \t\n\r":
            self.pos += 1
        elif char == "#":
            self.pos = _comment_end(text, pos)
            self.comments.append((pos, self.pos))
        elif char == '"':
            self._string()
        elif char == "$":
            self._variable()
        elif char == "@" and (fmt := _FORMAT.match(text, pos)):
            self._advance(fmt.end(), "format")
        elif char == "." or "0" <= char <= "9":
            self._dot_or_number()
        elif char == "_" or (char.isascii() and char.isalpha()):
            self._identifier()
        elif char in "([{":
            self.stack.append(char)
            self._advance(pos + 1, char)
        elif char in ")]}":
            top = self.stack[-1] if self.stack else ""
            if top != "\\(" or char == ")":  # a mismatched closer does not compile anyway
                if self.stack:
                    self.stack.pop()
            self._advance(pos + 1, "interpolation end" if top == "\\(" and char == ")" else char)
        elif text.startswith("?//", pos):
            self._advance(pos + 3, "?//")
        else:
            self._advance(pos + 1, char)

    def _advance(self, pos: int, kind: str) -> None:
        self.pos, self.prev = pos, kind

    def _string(self) -> None:
        """Skips a string literal; each interpolation `\\(…)` in it is scanned as code."""
        text, pos = self.text, self.pos + 1
        while pos < len(text):
            char = text[pos]
            if char == '"':
                self._advance(pos + 1, "literal")
                return
            if char != "\\":
                pos += 1
            elif not text.startswith("\\(", pos):
                pos += 2  # an escape, such as \" or \n
            else:
                self.stack.append("\\(")
                depth = len(self.stack)
                self._advance(pos + 2, "(")
                while self.pos < len(text) and not (self.prev == "interpolation end" and len(self.stack) < depth):
                    self._token()
                pos = self.pos
        self.pos = pos  # unterminated: jq refuses to compile it

    def _variable(self) -> None:
        text, pos = self.text, self.pos + 1
        while pos < len(text) and text[pos] in " \t\n\r":
            pos += 1  # `$ ENV` is a syntax error in jq 1.8; refuse it all the same
        ident = _IDENT.match(text, pos)
        if ident is None:
            self._advance(self.pos + 1, "$")
            return
        self._advance(ident.end(), "variable")
        # `$env` or `$input` are the rule's own variables; `$ENV` and `$__loc__` are jq's
        self.found.extend(f"${name}" for name in ident.group().split("::") if name in FORBIDDEN_VARIABLES)

    def _dot_or_number(self) -> None:
        text, pos = self.text, self.pos
        if text[pos] == "." and (field_name := _FIELD.match(text, pos + 1)):
            self._advance(field_name.end(), "field")  # `.env` is data, not the builtin
            return
        number = _NUMBER.match(text, pos)
        length = number.end() - pos if number else 1
        if text.startswith("..", pos) and length <= 2:
            self._advance(pos + 2, "..")
        elif length > 1 or text[pos] != ".":
            self._advance(pos + length, "literal")
        else:
            self._advance(pos + 1, ".")

    def _identifier(self) -> None:
        text = self.text
        ident = _IDENT.match(text, self.pos)
        if ident is None:  # unreachable: the caller saw [A-Za-z_]
            self._advance(self.pos + 1, "?")
            return
        prev = self.prev
        self._advance(ident.end(), "ident")
        names = ident.group().split("::")
        if self.stack and self.stack[-1] == "{" and prev in ("{", ",") and len(names) == 1:
            following = _skip_blank(text, self.pos)
            if text[following:following + 1] in (":", ",", "}") and not text.startswith("::", following):
                return  # an object key (`{env: 1}`), or `{env}` which means `{env: .env}`
        self.found.extend(name for name in names if name in FORBIDDEN_FUNCTIONS or name == "__loc__")


def _comment_end(text: str, pos: int) -> int:
    """jq 1.8: a comment runs to the end of the line; a backslash escapes the next character,
    so an odd number of backslashes before a newline continues the comment."""
    pos += 1
    while pos < len(text) and text[pos] != "\n":
        pos += 2 if text[pos] == "\\" else 1
    return min(pos, len(text))


def _skip_blank(text: str, pos: int) -> int:
    while pos < len(text):
        if text[pos] in " \t\n\r":
            pos += 1
        elif text[pos] == "#":
            pos = _comment_end(text, pos)
        else:
            break
    return pos
