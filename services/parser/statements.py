"""AVAP statements: an assignment or a command call, its arguments checked against the
command table (arity, name parameters, the if() comparator), and the lenient dialect's
expression assignments and calls of functions that may be defined further down.
"""

from __future__ import annotations

import re

from services.parser.blocks import BlockParser
from services.parser.commands import BLOCK_COMMANDS, COMMANDS, COMPARATORS
from services.parser.diagnostics import (
    ARG_COUNT,
    INVALID_ARGUMENT,
    INVALID_ASSIGNMENT,
    SYNTAX_ERROR,
    TOLERATED_UNKNOWN_COMMAND,
    UNKNOWN_COMMAND,
    snippet,
    suggest_command,
    unknown_message,
)
from services.parser.foreign import dotted_call
from services.parser.scan import Scan

# Identifiers are `[^\W\d]\w*`: Unicode letters are allowed (`año`), as in the runtime's
# Python namespace.
_IDENT = re.compile(r"[^\W\d]\w*\Z")
_ASSIGN = re.compile(r"([^\W\d]\w*)\s*=(?!=)\s*")
_CALL_HEAD = re.compile(r"([^\W\d][\w.]*)\s*\(")
_EXPR_CALL = re.compile(r"(?<![\w.])([^\W\d][\w.]*)\s*\(")
_ATTRIBUTE = re.compile(r"(?<![\w.])[^\W\d]\w*\.[^\W\d]")
_BAD_TARGET = re.compile(r"[^\W\d]\w*(?:\.\w+|\[[^\]]*\])+\s*=(?!=)")
_RHS_FOREIGN = re.compile(r"(await|new|lambda|function|yield)\b")
_EXPR_BUILTINS = frozenset({"str", "int", "float", "len"})  # what the Lite runtime evaluates
_LENIENT_BARE = frozenset({"end", "else", "endLoop", "try"})


class StatementParser(BlockParser):
    """The parser's statement layer, on top of the block layer; lenient unknown calls wait
    in `pending` for `resolve_pending` at the end of input."""

    def __init__(self, strict: bool) -> None:
        super().__init__(strict)
        # Lenient unknown calls wait for the end, since a function may be defined further
        # down: (line, column, name, argument count or -1, is a zero-argument call in a try).
        self.pending: list[tuple[int, int, str, int, bool]] = []

    def statement(self, n: int, c: int, s: str, scan: Scan, word: str) -> None:
        """A scanned line without foreign constructs: an assignment or a command call, else
        the error saying which statement it fails to be."""
        code = scan.code
        am = _ASSIGN.match(code)
        if am:
            self.assignment(n, c, s, scan, am)
            return
        cm = _CALL_HEAD.match(code)
        if cm and cm.end() - 1 == scan.first_open:
            if scan.first_close != len(code) - 1:
                tail = code[scan.first_close + 1 :]
                at = scan.first_close + 1 + len(tail) - len(tail.lstrip())
                self.report(
                    n,
                    c + at,
                    SYNTAX_ERROR,
                    f"unexpected text after ')': '{snippet(code[at:].strip())}'",
                )
                return
            self.call_scanned(n, c, cm.group(1), s, scan, target="")
            return
        if _IDENT.match(code):
            if not self.strict and code in _LENIENT_BARE:
                self.block(n, c, code)
            elif code in COMMANDS:
                self.report(
                    n,
                    c,
                    SYNTAX_ERROR,
                    f"missing parentheses: '{code}' must be called as a command",
                    COMMANDS[code].signature(),
                )
            else:
                self.report(
                    n,
                    c,
                    SYNTAX_ERROR,
                    f"unrecognized statement '{snippet(code)}' — expected command(...)",
                )
            return
        if _BAD_TARGET.match(code):
            self.report(
                n,
                c,
                INVALID_ASSIGNMENT,
                f"cannot assign to '{snippet(code.split('=')[0].strip())}' — set JSON keys with "
                "AddvariableToJSON(key, value, target)",
                "AddvariableToJSON",
            )
            return
        if word in COMMANDS:
            self.report(
                n,
                c,
                SYNTAX_ERROR,
                f"'{word}' must be called with parentheses",
                COMMANDS[word].signature(),
            )
            return
        self.report(
            n, c, SYNTAX_ERROR, f"unrecognized statement '{snippet(s)}' — expected command(...)"
        )

    def assignment(self, n: int, c: int, s: str, scan: Scan, am: re.Match[str]) -> None:
        target = am.group(1)
        code = scan.code
        rhs_at = am.end()
        if rhs_at >= len(code):
            self.report(n, c, INVALID_ASSIGNMENT, f"assignment to '{target}' has no value")
            return
        cm = _CALL_HEAD.match(code, rhs_at)
        if cm and cm.end() - 1 == scan.first_open and scan.first_close == len(code) - 1:
            self.call_scanned(n, c + rhs_at, cm.group(1), s, scan, target=target)
            return
        rhs = code[rhs_at:]
        for em in _EXPR_CALL.finditer(rhs):
            name = em.group(1)
            if "." in name:
                self.dotted(n, c + rhs_at + em.start(), name)
                return
        rf = _RHS_FOREIGN.match(rhs)
        if rf:
            self.foreign(n, c + rhs_at, s, "JavaScript/Python", f"AVAP has no '{rf.group(1)}'", "")
            return
        if "?" in rhs:
            self.foreign(n, c, s, "JavaScript", "AVAP has no ternary operator; use if(...)", "if")
            return
        am2 = _ATTRIBUTE.search(rhs)
        if am2:
            self.foreign(
                n,
                c + rhs_at + am2.start(),
                s,
                "Python/JavaScript",
                "read JSON keys with variableFromJSON(source, key, target)",
                "variableFromJSON",
            )
            return
        if self.strict:
            self.report(
                n,
                c,
                INVALID_ASSIGNMENT,
                f"strict AVAP assigns only command results (x = command(...)); got '{snippet(s)}'",
                f"addVar({target}, ...)",
            )
            return
        for em in _EXPR_CALL.finditer(rhs):
            name = em.group(1)
            if name not in _EXPR_BUILTINS and name not in COMMANDS:
                self.pending.append((n, c + rhs_at + em.start(), name, -1, False))

    def dotted(self, n: int, c: int, name: str) -> None:
        self.foreign(n, c, f"{name}(...)", *dotted_call(name))

    def call_scanned(self, n: int, c: int, name: str, s: str, scan: Scan, target: str) -> None:
        code = scan.code
        inner_from = scan.first_open + 1
        if code[inner_from : scan.first_close].strip():
            bounds = [inner_from, *(k + 1 for k in scan.commas), scan.first_close + 1]
            args = [code[bounds[i] : bounds[i + 1] - 1].strip() for i in range(len(bounds) - 1)]
            raw_args = [s[bounds[i] : bounds[i + 1] - 1].strip() for i in range(len(bounds) - 1)]
        else:
            args = raw_args = []
        self.call(n, c, name, args, raw_args, target)

    def call(
        self, n: int, c: int, name: str, args: list[str], raw_args: list[str], target: str
    ) -> None:
        """A command call; `c` is the column of the command name. `args` have string
        contents masked, `raw_args` are the source text."""
        if "." in name:
            self.dotted(n, c, name)
            return
        cmd = COMMANDS.get(name)
        if cmd is None:
            sugg = suggest_command(name)
            if sugg in BLOCK_COMMANDS:
                # `endIf()` / `End()` / `catch(e)`: report it, then apply the block command it
                # stands for so the structure stays right and errors do not cascade.
                self.report(n, c, UNKNOWN_COMMAND, unknown_message(name), sugg)
                self.block(n, c, sugg)
            elif self.strict:
                self.report(n, c, UNKNOWN_COMMAND, unknown_message(name), sugg)
            else:
                # Decided at the end: it may be a function defined further down.
                probe = not args and not target and self.in_try()
                self.pending.append((n, c, name, len(args), probe))
            return
        if target and name in BLOCK_COMMANDS and (self.strict or name != "exception"):
            self.report(
                n,
                c,
                INVALID_ASSIGNMENT,
                f"'{name}' is a block command and cannot be assigned to '{target}'",
                f"{name}(...)",
            )
        expected = cmd.arity
        ok_count = len(args) == expected or (
            not self.strict and name == "exception" and len(args) == 0
        )
        if not ok_count:
            self.report(
                n,
                c,
                ARG_COUNT,
                f"'{name}' expects {expected} argument{'s' if expected != 1 else ''} "
                f"({', '.join(p.name for p in cmd.params) or 'none'}) but got {len(args)}",
                cmd.signature(),
            )
        elif len(args) == expected:
            self.check_args(n, c, name, args, raw_args)
        if name in BLOCK_COMMANDS:
            self.block(n, c, name)

    def check_args(self, n: int, c: int, name: str, args: list[str], raw_args: list[str]) -> None:
        cmd = COMMANDS[name]
        for arg, raw, param in zip(args, raw_args, cmd.params, strict=True):
            if "(" in arg:
                cm = _CALL_HEAD.match(arg)
                if cm and "." in cm.group(1):
                    self.dotted(n, c, cm.group(1))
                    return
                if (
                    cm
                    and self.strict
                    and (cm.group(1) in COMMANDS or cm.group(1) in _EXPR_BUILTINS)
                ):
                    self.report(
                        n,
                        c,
                        INVALID_ARGUMENT,
                        f"nested call '{snippet(raw)}' in {name}() — call the command on its own "
                        "line and pass its target variable",
                    )
                    return
            if self.strict and param.is_name and not _IDENT.match(arg):
                bare = raw.strip("\"'`")
                self.report(
                    n,
                    c,
                    INVALID_ARGUMENT,
                    f"{name}() parameter '{param.name}' must be a variable name, "
                    f"got '{snippet(raw)}'",
                    bare if _IDENT.match(bare) else "",
                )
                return
        if name == "if":
            comparator = raw_args[2]
            if (
                not self.strict
                and len(comparator) >= 2
                and comparator[0] == comparator[-1] in "\"'"
            ):
                comparator = comparator[1:-1]
            if comparator not in COMPARATORS:
                self.report(
                    n,
                    c,
                    INVALID_ARGUMENT,
                    f"if() comparator must be one of {' '.join(sorted(COMPARATORS))}, "
                    f"got '{snippet(raw_args[2])}'",
                    "if(variable, value, comparator)",
                )

    def resolve_pending(self) -> None:
        """At the end of input: each lenient unknown call is a user function's (its
        argument count checked), a tolerated probe inside a try, or an unknown command."""
        for n, c, name, nargs, probe in self.pending:
            arity = self.functions.get(name)
            if arity is not None:
                if nargs >= 0 and nargs != arity:
                    self.report(
                        n,
                        c,
                        ARG_COUNT,
                        f"function '{name}' expects {arity} argument(s) but got {nargs}",
                    )
                continue
            sugg = suggest_command(name)
            if probe and not sugg:
                self.report(
                    n,
                    c,
                    TOLERATED_UNKNOWN_COMMAND,
                    f"unknown command '{name}()' tolerated inside try(): a deliberate "
                    "runtime-error probe that the exception handler catches",
                )
            else:
                self.report(n, c, UNKNOWN_COMMAND, unknown_message(name), sugg)
