"""The AVAP command table (spec v1.0.0, 27 commands), written out as facts.

Each command maps to its positional parameters. A parameter is a *name* parameter when the
command writes to (or exports) the variable it names: strict mode then requires a bare
identifier there (`addVar(total, 0)`, not `addVar("total", 0)`). Every other parameter
takes a literal or a variable reference, including empty arguments (`RequestGet(u, , , r)`).
"""

from __future__ import annotations

from typing import NamedTuple


class Param(NamedTuple):
    name: str
    is_name: bool = False  # must be a bare variable identifier in strict mode


class Command(NamedTuple):
    name: str
    params: tuple[Param, ...]
    category: str

    @property
    def arity(self) -> int:
        return len(self.params)

    def signature(self) -> str:
        return f"{self.name}({', '.join(p.name for p in self.params)})"


def _cmd(name: str, category: str, *params: str) -> Command:
    # A leading "@" marks a name parameter; it keeps the table below one line per command.
    return Command(
        name,
        tuple(Param(p.lstrip("@"), p.startswith("@")) for p in params),
        category,
    )


_TABLE: tuple[Command, ...] = (
    # Variables
    _cmd("addVar", "Variables", "@targetVarName", "varValue"),
    _cmd("addResult", "Variables", "@sourceVariable"),
    _cmd("addParam", "Variables", "param", "@variable"),
    # Control flow and loops (block structure is checked by the parser)
    _cmd("if", "Control Flow", "variable", "variableValue", "comparator"),
    _cmd("else", "Control Flow"),
    _cmd("end", "Control Flow"),
    _cmd("startLoop", "Loops", "@varName", "from", "to"),
    _cmd("endLoop", "Loops"),
    # Error handling
    _cmd("try", "Error Handling"),
    _cmd("exception", "Error Handling", "@error"),
    # HTTP
    _cmd("RequestGet", "HTTP", "url", "querystring", "headers", "@o_result"),
    _cmd("RequestPost", "HTTP", "url", "querystring", "headers", "body", "@o_result"),
    # Cryptography
    _cmd("randomString", "Cryptography", "Pattern", "Length", "@TargetVariable"),
    _cmd("encodeSHA256", "Cryptography", "SourceVariable", "@TargetVariable"),
    _cmd("encodeMD5", "Cryptography", "SourceVariable", "@TargetVariable"),
    # String
    _cmd("replace", "String", "SourceVariable", "rePattern", "newValue", "@TargetVariable"),
    _cmd("getRegex", "String", "SourceVariable", "rePattern", "@TargetVariable"),
    # Database
    _cmd("ormDirect", "Database", "prompt", "@TargetVariable"),
    # DateTime
    _cmd("getDateTime", "DateTime", "Format", "TimeDelta", "TimeZone", "@TargetVariable"),
    _cmd("getTimeStamp", "DateTime", "DateString", "Format", "TimeDelta", "@TargetVariable"),
    _cmd("stampToDatetime", "DateTime", "timestamp", "Format", "TimeDelta", "@TargetVariable"),
    # Request
    _cmd("getQueryParamList", "Request", "@TargetVariable"),
    # Collections
    _cmd("getListLen", "Collections", "SourceVariable", "@TargetVariable"),
    _cmd("itemFromList", "Collections", "SourceVariable", "index", "@TargetVariable"),
    _cmd("variableToList", "Collections", "element", "@TargetVariable"),
    # JSON
    _cmd("AddvariableToJSON", "JSON", "Key", "Value", "@TargetVariable"),
    _cmd("variableFromJSON", "JSON", "SourceVariable", "key", "@TargetVariable"),
)

COMMANDS: dict[str, Command] = {c.name: c for c in _TABLE}

# Commands that open, split or close blocks; the parser tracks them on a stack.
BLOCK_COMMANDS: frozenset[str] = frozenset(
    {"if", "else", "end", "startLoop", "endLoop", "try", "exception"}
)

COMPARATORS: frozenset[str] = frozenset({"=", "==", "!=", "<", ">", "<=", ">="})

# Hallucinated names seen in LLM output (ADR-0007/0009) and common foreign spellings,
# mapped to the AVAP command that does the job. Edit distance covers the rest.
ALIASES: dict[str, str] = {
    "getSHA256": "encodeSHA256",
    "sha256": "encodeSHA256",
    "hashSHA256": "encodeSHA256",
    "hash": "encodeSHA256",
    "md5": "encodeMD5",
    "getMD5": "encodeMD5",
    "returnResult": "addResult",
    "return_result": "addResult",
    "setResult": "addResult",
    "addResponse": "addResult",
    "respond": "addResult",
    "output": "addResult",
    "echo": "addResult",
    "readParam": "addParam",
    "getParam": "addParam",
    "getParameter": "addParam",
    "requestParam": "addParam",
    "setVar": "addVar",
    "setVariable": "addVar",
    "assign": "addVar",
    "httpGet": "RequestGet",
    "fetch": "RequestGet",
    "get": "RequestGet",
    "httpPost": "RequestPost",
    "post": "RequestPost",
    "query": "ormDirect",
    "sqlQuery": "ormDirect",
    "dbQuery": "ormDirect",
    "executeSQL": "ormDirect",
    "ormQuery": "ormDirect",
    "len": "getListLen",
    "length": "getListLen",
    "listLength": "getListLen",
    "getLength": "getListLen",
    "now": "getDateTime",
    "getDate": "getDateTime",
    "getTime": "getDateTime",
    "regex": "getRegex",
    "match": "getRegex",
    "getJSON": "variableFromJSON",
    "jsonGet": "variableFromJSON",
    "setJSON": "AddvariableToJSON",
    "addToJSON": "AddvariableToJSON",
    "append": "variableToList",
    "push": "variableToList",
    "addToList": "variableToList",
    "getItem": "itemFromList",
    "random": "randomString",
    "uuid": "randomString",
    "getQueryParams": "getQueryParamList",
    "catch": "exception",
    "except": "exception",
    "endIf": "end",
    "endif": "end",
    "endTry": "end",
    "fi": "end",
    "endFor": "endLoop",
    "endWhile": "endLoop",
    "forEach": "startLoop",
    "loop": "startLoop",
    "for": "startLoop",
    "while": "startLoop",
}
