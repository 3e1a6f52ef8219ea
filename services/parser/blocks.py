"""Block structure of an AVAP program: the stack of open blocks (if, startLoop, try and
its exception handler, lenient user functions), the commands that open and close them,
and the report of blocks left open.

A mismatched closer is reported once and assumed to close the innermost block, so one
mistake does not cascade into errors on every later line.
"""

from __future__ import annotations

from services.parser.diagnostics import (
    SYNTAX_ERROR,
    UNCLOSED_BLOCK,
    UNEXPECTED_BLOCK_END,
    Reporter,
)

_BLOCK_CLOSER = {"if": "end()", "loop": "endLoop()", "try": "end()", "exc": "end()", "func": "}"}
_BLOCK_LABEL = {
    "if": "if()",
    "loop": "startLoop()",
    "try": "try()",
    "exc": "try()/exception()",
    "func": "function",
}


class Frame:
    __slots__ = ("closed_by_mismatch", "column", "has_else", "kind", "line")

    def __init__(self, kind: str, line: int, column: int) -> None:
        self.kind = kind  # "if" | "loop" | "try" | "exc" | "func"
        self.line = line
        self.column = column
        self.has_else = False
        # Set when a mismatched closer popped the frame above this one while matching this
        # frame's kind: that closer was probably meant for it, so it is not reported again.
        self.closed_by_mismatch = False


class BlockParser(Reporter):
    """The parser's block layer: the open-block stack and the lenient user functions
    (name -> arity) defined so far."""

    def __init__(self, strict: bool) -> None:
        super().__init__()
        self.strict = strict
        self.stack: list[Frame] = []
        self.functions: dict[str, int] = {}  # lenient user functions: name -> arity

    def in_try(self) -> bool:
        return any(f.kind == "try" for f in self.stack)

    def open_function(self, n: int, c: int, name: str, params: str) -> None:
        if any(f.kind == "func" for f in self.stack):
            self.report(n, c, SYNTAX_ERROR, f"function '{name}' defined inside another function")
            return
        self.functions[name] = len([p for p in params.split(",") if p.strip()])
        self.stack.append(Frame("func", n, c))

    def block(self, n: int, c: int, name: str) -> None:
        if name == "if":
            self.stack.append(Frame("if", n, c))
        elif name == "startLoop":
            self.stack.append(Frame("loop", n, c))
        elif name == "try":
            self.stack.append(Frame("try", n, c))
        elif name == "end":
            self.close_block(n, c, "end()", ("if", "try", "exc"))
        elif name == "endLoop":
            self.close_block(n, c, "endLoop()", ("loop",))
        elif name == "else":
            self.else_(n, c)
        elif name == "exception":
            self.exception(n, c)

    def drop_lenient_handlers(self, keep: tuple[str, ...]) -> None:
        # Lenient: an open exception handler ends where its enclosing block ends.
        if not self.strict:
            while self.stack and self.stack[-1].kind == "exc" and "exc" not in keep:
                self.stack.pop()

    def close_block(self, n: int, c: int, closer: str, kinds: tuple[str, ...]) -> None:
        self.drop_lenient_handlers(kinds)
        if not self.stack:
            self.report(n, c, UNEXPECTED_BLOCK_END, f"{closer} without an open block")
            return
        top = self.stack[-1]
        if top.kind in kinds:
            self.stack.pop()
            if top.kind == "try" and self.strict:
                self.report(
                    n,
                    c,
                    SYNTAX_ERROR,
                    f"try() opened at line {top.line} is closed without an exception(var) handler",
                    "exception",
                )
            return
        self.stack.pop()  # assume the closer was meant for the innermost block
        below = self.stack[-1] if self.stack else None
        if below is not None and below.kind in kinds:
            below.closed_by_mismatch = True
        self.report(
            n,
            c,
            UNEXPECTED_BLOCK_END,
            f"{closer} cannot close {_BLOCK_LABEL[top.kind]} opened at line {top.line} — "
            f"close it with {_BLOCK_CLOSER[top.kind]}",
            _BLOCK_CLOSER[top.kind],
        )

    def else_(self, n: int, c: int) -> None:
        self.drop_lenient_handlers(())
        top = self.stack[-1] if self.stack else None
        if top is None or top.kind != "if":
            where = (
                f" (innermost open block: {_BLOCK_LABEL[top.kind]} at line {top.line})"
                if top
                else ""
            )
            self.report(n, c, UNEXPECTED_BLOCK_END, f"else() without a matching if(){where}", "if")
        elif top.has_else:
            self.report(
                n,
                c,
                UNEXPECTED_BLOCK_END,
                f"second else() for if() opened at line {top.line}",
                "end",
            )
        else:
            top.has_else = True

    def exception(self, n: int, c: int) -> None:
        top = self.stack[-1] if self.stack else None
        if top is not None and top.kind == "try":
            top.kind = "exc"
            return
        if top is not None and any(f.kind == "try" for f in self.stack):
            # A block inside the try body was left open: report it, then recover.
            self.report(
                n,
                c,
                UNEXPECTED_BLOCK_END,
                f"exception() while {_BLOCK_LABEL[top.kind]} opened at line {top.line} "
                "is still open — "
                f"close it with {_BLOCK_CLOSER[top.kind]} first",
                _BLOCK_CLOSER[top.kind],
            )
            while self.stack[-1].kind != "try":
                self.stack.pop()
            self.stack[-1].kind = "exc"
            return
        self.report(n, c, UNEXPECTED_BLOCK_END, "exception() without a matching try()", "try")

    def report_unclosed(self) -> None:
        """At the end of input: each block still open (bar those a mismatched closer was
        probably meant for, and lenient mode's open exception handlers)."""
        for frame in self.stack:
            if frame.closed_by_mismatch or (frame.kind == "exc" and not self.strict):
                continue
            self.report(
                frame.line,
                frame.column,
                UNCLOSED_BLOCK,
                f"{_BLOCK_LABEL[frame.kind]} opened here is never closed — "
                f"add {_BLOCK_CLOSER[frame.kind]}",
                _BLOCK_CLOSER[frame.kind],
            )
