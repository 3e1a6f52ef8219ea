"""Every Postgres role's privileges, read from a live server and rendered as Markdown
(`docs/reference/permissions-postgres.md`, `intentroute docs permissions-postgres`).

What is read, from the catalogs of the database connected to (any role may read them):
the deployment's roles' attributes and memberships (`shared.store.roles.ROLES`, and
whoever is a member of them or they of), and the access control list of every object
that holds data or runs code in the database's own schemas: the database, the schemas,
tables, views and sequences, their columns, functions (with SECURITY DEFINER and their
pinned settings), triggers and default privileges. A grant to any other role, or to
PUBLIC, shows in its own column, so nothing granted is left out. Rows and privileges
are sorted: the same server state renders byte for byte the same.

The request log's day partitions (made at run time, named after their day) are one
row, `request_log_p<YYYYMMDD>`, holding what any of them grants. Types and languages are
left out (USAGE on them reaches no row).

`generate()` deploys a throwaway embedded Postgres as `intentroute up` does (the
superuser's init, then every migration as the owner) and renders it.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import asyncpg

from shared.store import asyncpg_dsn
from shared.store.partitions import TABLE as REQUEST_LOG
from shared.store.partitions import day_of
from shared.store.roles import ROLES

if TYPE_CHECKING:
    from intentroute.stack import PostgresServer
    from intentroute.stack.pgroles import DatabaseUrls

# Where the committed copy lives (relative to the repository root, the usual cwd).
DEFAULT_OUT = Path("docs/reference/permissions-postgres.md")
PUBLIC = "PUBLIC"
OTHERS = "other roles"
DAY_PARTITIONS = f"{REQUEST_LOG}_p<YYYYMMDD>"
_PREFIX = "intentroute_"

# The order privileges are written in; one Postgres adds later goes last, by name.
_ORDER = ("SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER",
          "MAINTAIN", "EXECUTE", "USAGE", "CREATE", "CONNECT", "TEMPORARY")
_KINDS = {"r": "table", "p": "partitioned table", "v": "view", "m": "materialized view",
          "f": "foreign table", "S": "sequence"}
_ENABLED = {"O": "yes", "D": "disabled", "R": "replica only", "A": "always"}
_DEFAULT_ACL_KINDS = {"r": "tables", "S": "sequences", "f": "functions", "T": "types",
                      "n": "schemas", "L": "large objects"}

# The schemas of the database's own objects (not the catalogs).
_SCHEMAS = """
SELECT n.oid FROM pg_catalog.pg_namespace n
WHERE n.nspname <> 'information_schema' AND n.nspname !~ '^pg_'
"""
# (object, its owner, grantee, privilege, grantable), the owner's implicit privileges
# included (acldefault when no ACL was ever set).
_ACL = """
SELECT {name} AS object, pg_catalog.pg_get_userbyid({owner}) AS owner,
       CASE WHEN a.grantee = 0 THEN 'PUBLIC'
            ELSE pg_catalog.pg_get_userbyid(a.grantee) END AS grantee,
       a.privilege_type AS privilege, a.is_grantable AS grantable
FROM {source}
CROSS JOIN LATERAL pg_catalog.aclexplode(
    COALESCE({acl}, pg_catalog.acldefault('{kind}', {owner}))) AS a
"""
_SQL_DATABASE = _ACL.format(
    name="d.datname", owner="d.datdba", acl="d.datacl", kind="d",
    source="pg_catalog.pg_database d") + " WHERE d.datname = current_database()"
_SQL_SCHEMAS = _ACL.format(
    name="n.nspname", owner="n.nspowner", acl="n.nspacl", kind="n",
    source="pg_catalog.pg_namespace n") + f" WHERE n.oid IN ({_SCHEMAS})"
# acldefault's kind follows the relation's ('s' for a sequence).
_SQL_RELATIONS = f"""
SELECT c.relname AS object, c.relkind::text AS kind, n.nspname AS schema,
       pg_catalog.pg_get_userbyid(c.relowner) AS owner,
       CASE WHEN a.grantee = 0 THEN 'PUBLIC'
            ELSE pg_catalog.pg_get_userbyid(a.grantee) END AS grantee,
       a.privilege_type AS privilege, a.is_grantable AS grantable
FROM pg_catalog.pg_class c
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
CROSS JOIN LATERAL pg_catalog.aclexplode(COALESCE(c.relacl, pg_catalog.acldefault(
    CASE WHEN c.relkind = 'S' THEN 's' ELSE 'r' END::"char", c.relowner))) AS a
WHERE c.relnamespace IN ({_SCHEMAS}) AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'S')
"""
_SQL_FUNCTIONS = f"""
SELECT p.proname || '(' || pg_catalog.oidvectortypes(p.proargtypes) || ')' AS object,
       n.nspname AS schema, p.prosecdef AS definer,
       COALESCE(array_to_string(p.proconfig, '; '), '') AS config,
       pg_catalog.pg_get_userbyid(p.proowner) AS owner,
       CASE WHEN a.grantee = 0 THEN 'PUBLIC'
            ELSE pg_catalog.pg_get_userbyid(a.grantee) END AS grantee,
       a.privilege_type AS privilege, a.is_grantable AS grantable
FROM pg_catalog.pg_proc p
JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
CROSS JOIN LATERAL pg_catalog.aclexplode(
    COALESCE(p.proacl, pg_catalog.acldefault('f', p.proowner))) AS a
WHERE p.pronamespace IN ({_SCHEMAS})
"""
_SQL_COLUMNS = f"""
SELECT c.relname AS object, n.nspname AS schema, att.attname AS column_name,
       CASE WHEN a.grantee = 0 THEN 'PUBLIC'
            ELSE pg_catalog.pg_get_userbyid(a.grantee) END AS grantee,
       a.privilege_type AS privilege, a.is_grantable AS grantable
FROM pg_catalog.pg_attribute att
JOIN pg_catalog.pg_class c ON c.oid = att.attrelid
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
CROSS JOIN LATERAL pg_catalog.aclexplode(att.attacl) AS a
WHERE c.relnamespace IN ({_SCHEMAS}) AND att.attnum > 0 AND NOT att.attisdropped
  AND att.attacl IS NOT NULL
"""
_SQL_ALL_COLUMNS = f"""
SELECT c.relname AS object, n.nspname AS schema, att.attname AS column_name
FROM pg_catalog.pg_attribute att
JOIN pg_catalog.pg_class c ON c.oid = att.attrelid
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE c.relnamespace IN ({_SCHEMAS}) AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
  AND att.attnum > 0 AND NOT att.attisdropped
"""
_SQL_TRIGGERS = f"""
SELECT n.nspname AS schema, c.relname AS table_name, t.tgname AS trigger,
       p.proname AS function, p.prosecdef AS definer, t.tgenabled::text AS enabled
FROM pg_catalog.pg_trigger t
JOIN pg_catalog.pg_class c ON c.oid = t.tgrelid
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
JOIN pg_catalog.pg_proc p ON p.oid = t.tgfoid
WHERE NOT t.tgisinternal AND c.relnamespace IN ({_SCHEMAS}) AND t.tgparentid = 0
"""
_SQL_DEFAULT_ACL = """
SELECT pg_catalog.pg_get_userbyid(d.defaclrole) AS role,
       COALESCE(n.nspname, '(every schema)') AS schema, d.defaclobjtype::text AS kind,
       CASE WHEN a.grantee = 0 THEN 'PUBLIC'
            ELSE pg_catalog.pg_get_userbyid(a.grantee) END AS grantee,
       a.privilege_type AS privilege, a.is_grantable AS grantable
FROM pg_catalog.pg_default_acl d
LEFT JOIN pg_catalog.pg_namespace n ON n.oid = d.defaclnamespace
CROSS JOIN LATERAL pg_catalog.aclexplode(d.defaclacl) AS a
"""
_SQL_ROLES = """
SELECT r.rolname, r.rolcanlogin, r.rolsuper, r.rolcreatedb, r.rolcreaterole,
       r.rolreplication, r.rolbypassrls, r.rolinherit, r.rolconnlimit
FROM pg_catalog.pg_roles r WHERE r.rolname = ANY($1::text[])
"""
_SQL_MEMBERSHIPS = """
SELECT pg_catalog.pg_get_userbyid(m.roleid) AS role,
       pg_catalog.pg_get_userbyid(m.member) AS member, m.admin_option
FROM pg_catalog.pg_auth_members m
WHERE pg_catalog.pg_get_userbyid(m.roleid) = ANY($1::text[])
   OR pg_catalog.pg_get_userbyid(m.member) = ANY($1::text[])
"""


@dataclass
class Grants:
    """Who holds what on one object: grantee -> privilege -> grantable; column
    privileges as grantee -> privilege -> column -> grantable."""

    owners: set[str] = field(default_factory=set)
    table: dict[str, dict[str, bool]] = field(
        default_factory=lambda: defaultdict(dict))
    columns: dict[str, dict[str, dict[str, bool]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(dict)))
    # Every column of the relation (for "all columns but").
    all_columns: set[str] = field(default_factory=set)
    # Everything an owner holds on this kind of object (for "ALL").
    full: set[str] = field(default_factory=set)

    def add(self, owner: str, grantee: str, privilege: str, grantable: bool) -> None:
        self.owners.add(owner)
        held = self.table[grantee]
        held[privilege] = held.get(privilege, False) or grantable
        if grantee == owner:
            self.full.add(privilege)


@dataclass
class Permissions:
    database: str = ""
    roles: list[dict[str, object]] = field(default_factory=list)
    # (role, member, admin option)
    memberships: list[tuple[str, str, bool]] = field(default_factory=list)
    objects: dict[str, dict[str, Grants]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(Grants)))
    kinds: dict[str, str] = field(default_factory=dict)
    functions: dict[str, tuple[bool, str]] = field(default_factory=dict)
    triggers: list[tuple[str, str, str, bool, str]] = field(default_factory=list)
    # (role, schema, kind) -> grantee -> privilege -> grantable
    default_acl: dict[tuple[str, str, str], dict[str, dict[str, bool]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(dict)))


def _qualified(schema: str, name: str) -> str:
    return name if schema == "public" else f"{schema}.{name}"


def _relation(schema: str, name: str) -> str:
    """A relation's row: the day partitions of the request log share one."""
    if schema == "public" and day_of(name) is not None:
        return DAY_PARTITIONS
    return _qualified(schema, name)


async def read_permissions(conn: asyncpg.Connection) -> Permissions:
    """The live grants of the database `conn` is connected to."""
    perms = Permissions(database=await conn.fetchval("SELECT current_database()"))
    roles = list(ROLES)
    perms.roles = [dict(r) for r in await conn.fetch(_SQL_ROLES, roles)]
    perms.memberships = sorted((r["role"], r["member"], r["admin_option"])
                               for r in await conn.fetch(_SQL_MEMBERSHIPS, roles))
    for r in await conn.fetch(_SQL_DATABASE):
        perms.objects["database"][r["object"]].add(
            r["owner"], r["grantee"], r["privilege"], r["grantable"])
    for r in await conn.fetch(_SQL_SCHEMAS):
        perms.objects["schema"][r["object"]].add(
            r["owner"], r["grantee"], r["privilege"], r["grantable"])
    for r in await conn.fetch(_SQL_RELATIONS):
        name = _relation(r["schema"], r["object"])
        section = "sequence" if r["kind"] == "S" else "relation"
        perms.kinds[name] = _KINDS.get(r["kind"], r["kind"])
        perms.objects[section][name].add(r["owner"], r["grantee"], r["privilege"],
                                         r["grantable"])
    for r in await conn.fetch(_SQL_ALL_COLUMNS):
        name = _relation(r["schema"], r["object"])
        if name in perms.objects["relation"]:
            perms.objects["relation"][name].all_columns.add(r["column_name"])
    for r in await conn.fetch(_SQL_COLUMNS):
        name = _relation(r["schema"], r["object"])
        section = "sequence" if name in perms.objects["sequence"] else "relation"
        held = perms.objects[section][name].columns[r["grantee"]][r["privilege"]]
        held[r["column_name"]] = held.get(r["column_name"], False) or r["grantable"]
    for r in await conn.fetch(_SQL_FUNCTIONS):
        name = _qualified(r["schema"], r["object"])
        perms.objects["function"][name].add(
            r["owner"], r["grantee"], r["privilege"], r["grantable"])
        perms.functions[name] = (r["definer"], r["config"])
    perms.triggers = sorted(
        (_qualified(r["schema"], r["table_name"]), r["trigger"], r["function"],
         r["definer"], _ENABLED.get(r["enabled"], r["enabled"]))
        for r in await conn.fetch(_SQL_TRIGGERS))
    for r in await conn.fetch(_SQL_DEFAULT_ACL):
        key = (r["role"], r["schema"], _DEFAULT_ACL_KINDS.get(r["kind"], r["kind"]))
        held = perms.default_acl[key][r["grantee"]]
        held[r["privilege"]] = held.get(r["privilege"], False) or r["grantable"]
    return perms


def _privilege_key(privilege: str) -> tuple[int, str]:
    return (_ORDER.index(privilege) if privilege in _ORDER else len(_ORDER), privilege)


def _privileges(held: Mapping[str, bool], full: Iterable[str] = ()) -> list[str]:
    """Privileges in order, `*` marking the grant option; ALL when it is everything."""
    everything = set(full)
    if len(everything) > 1 and set(held) == everything and len(set(held.values())) == 1:
        return ["ALL" + ("*" if next(iter(held.values())) else "")]
    return [p + ("*" if held[p] else "") for p in sorted(held, key=_privilege_key)]


def _columns(held: Mapping[str, bool], every: set[str]) -> str:
    """The columns a privilege is held on: named, or as the relation's other columns
    when it is more than half of them (all held alike)."""
    marks = set(held.values())
    if len(marks) == 1 and set(held) <= every and 2 * len(held) > len(every):
        star = "*" if marks.pop() else ""
        rest = sorted(every - set(held))
        return f"{star} (all columns but {', '.join(rest)})" if rest else f"{star} (all columns)"
    return " (" + ", ".join(c + ("*" if held[c] else "") for c in sorted(held)) + ")"


def _cell(grants: Grants, grantee: str) -> str:
    parts = _privileges(grants.table.get(grantee, {}), grants.full)
    for privilege in sorted(grants.columns.get(grantee, {}), key=_privilege_key):
        parts.append(privilege + _columns(grants.columns[grantee][privilege],
                                          grants.all_columns))
    return ", ".join(parts)


def _others(grants: Grants) -> str:
    """Grants to any role that is not the deployment's (nor PUBLIC)."""
    who = sorted((set(grants.table) | set(grants.columns)) - set(ROLES) - {PUBLIC})
    return "; ".join(f"{role}: {_cell(grants, role)}" for role in who
                     if _cell(grants, role))


def _short(role: str) -> str:
    return role.removeprefix(_PREFIX)


def _row(cells: Iterable[str]) -> str:
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def _table(header: list[str], rows: Iterable[list[str]]) -> list[str]:
    lines = [_row(header), _row(["---"] * len(header))]
    lines += [_row(r) for r in rows]
    return lines


def _grant_columns() -> list[str]:
    return [*(f"`{_short(r)}`" for r in ROLES), PUBLIC, OTHERS]


def _grant_cells(grants: Grants) -> list[str]:
    return [*(_cell(grants, r) for r in ROLES), _cell(grants, PUBLIC), _others(grants)]


def _yes(flag: object) -> str:
    return "yes" if flag else ""


def render(perms: Permissions) -> str:
    """The Markdown document (ends with one newline)."""
    out = [
        "# Postgres roles and privileges",
        "",
        "<!-- Generated by `intentroute docs permissions-postgres`; do not edit by hand.",
        "     tests/integration/test_postgres_privileges.py fails when a live server",
        "     deployed as `intentroute up` deploys it grants anything else. -->",
        "",
        f"Every privilege the deployment's roles hold in database `{perms.database}`, read "
        "from the catalogs of a live server after the superuser's init (`intentroute "
        "db-init`) and every migration (run as the owner), sorted:",
        "",
        "- a column per role: " + ", ".join(f"`{_short(r)}` is `{r}`" for r in ROLES)
        + f"; `{PUBLIC}`: granted to every role; `{OTHERS}`: to any other role;",
        "- `ALL`: every privilege of the object's kind (what its owner holds); `*`: with "
        "grant option; `PRIV (a, b)`: on those columns only;",
        f"- `{DAY_PARTITIONS}`: every day partition of the request log (made at run time).",
        "",
        "## Roles",
        "",
    ]
    members: dict[str, list[str]] = defaultdict(list)
    member_of: dict[str, list[str]] = defaultdict(list)
    for role, member, admin in perms.memberships:
        members[role].append(member + (" (admin)" if admin else ""))
        member_of[member].append(role + (" (admin)" if admin else ""))
    found = {str(r["rolname"]): r for r in perms.roles}
    rows = []
    for role in ROLES:
        r = found.get(role)
        if r is None:
            rows.append([f"`{role}`", "missing", "", "", "", "", "", "", "", "", ""])
            continue
        limit = int(str(r["rolconnlimit"]))
        rows.append([f"`{role}`", _yes(r["rolcanlogin"]), _yes(r["rolsuper"]),
                     _yes(r["rolcreatedb"]), _yes(r["rolcreaterole"]),
                     _yes(r["rolreplication"]), _yes(r["rolbypassrls"]),
                     _yes(r["rolinherit"]), "" if limit < 0 else str(limit),
                     ", ".join(sorted(member_of[role])), ", ".join(sorted(members[role]))])
    out += _table(["role", "LOGIN", "SUPERUSER", "CREATEDB", "CREATEROLE", "REPLICATION",
                   "BYPASSRLS", "INHERIT", "connection limit", "member of", "members"], rows)
    out += ["", "## Database and schemas", ""]
    rows = [[f"database `{name}`", ", ".join(sorted(g.owners)), *_grant_cells(g)]
            for name, g in sorted(perms.objects["database"].items())]
    rows += [[f"schema `{name}`", ", ".join(sorted(g.owners)), *_grant_cells(g)]
             for name, g in sorted(perms.objects["schema"].items())]
    out += _table(["object", "owner", *_grant_columns()], rows)
    out += ["", "## Tables and views", ""]
    rows = [[f"`{name}`", perms.kinds[name], ", ".join(sorted(g.owners)), *_grant_cells(g)]
            for name, g in sorted(perms.objects["relation"].items())]
    out += _table(["relation", "kind", "owner", *_grant_columns()], rows)
    out += ["", "## Sequences", ""]
    rows = [[f"`{name}`", ", ".join(sorted(g.owners)), *_grant_cells(g)]
            for name, g in sorted(perms.objects["sequence"].items())]
    out += _table(["sequence", "owner", *_grant_columns()], rows or [["none"] + [""] * 10])
    out += ["", "## Functions", ""]
    rows = []
    for name, g in sorted(perms.objects["function"].items()):
        definer, config = perms.functions.get(name, (False, ""))
        rows.append([f"`{name}`", ", ".join(sorted(g.owners)),
                     "DEFINER" if definer else "invoker", f"`{config}`" if config else "",
                     *_grant_cells(g)])
    out += _table(["function", "owner", "security", "settings", *_grant_columns()], rows)
    out += ["", "## Triggers", ""]
    rows = [[f"`{table}`", f"`{trigger}`", f"`{function}`",
             "DEFINER" if definer else "invoker", enabled]
            for table, trigger, function, definer, enabled in perms.triggers]
    out += _table(["table", "trigger", "function", "security", "enabled"],
                  rows or [["none", "", "", "", ""]])
    out += ["", "## Default privileges", ""]
    rows = [[f"`{role}`", schema, kind,
             "; ".join(f"{grantee}: {', '.join(_privileges(held))}"
                       for grantee, held in sorted(grantees.items()))]
            for (role, schema, kind), grantees in sorted(perms.default_acl.items())]
    out += _table(["role", "schema", "objects", "granted on creation"],
                  rows or [["none", "", "", ""]])
    return "\n".join(out) + "\n"


async def render_live(database_url: str) -> str:
    """The document for the database at `database_url` (any role may read the catalogs)."""
    conn = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        return render(await read_permissions(conn))
    finally:
        await conn.close()


def deploy(pg: PostgresServer) -> DatabaseUrls:
    """Roles, database and schema on `pg` as `intentroute up` makes them: the superuser's
    init (`stack_cmds._database_roles`), then every migration as the owner, with the
    owner's settings at their defaults."""
    from intentroute.stack.pgroles import database_urls, init_database, role_passwords
    from shared.store import migrate
    from shared.store.owner_settings import OwnerSettings

    passwords = role_passwords(pg.data_dir)
    asyncio.run(init_database(pg.url, pg.DB, passwords))
    urls = database_urls(pg.url, passwords)
    migrate(urls.owner, OwnerSettings())
    return urls


def generate() -> str:
    """The document from a throwaway embedded Postgres deployed as `up` does."""
    from intentroute.stack import PostgresServer

    with tempfile.TemporaryDirectory(prefix="intentroute-permissions-") as tmp:
        pg = PostgresServer(Path(tmp) / "postgres").start()
        try:
            deploy(pg)
            return asyncio.run(render_live(pg.url))
        finally:
            pg.stop()
