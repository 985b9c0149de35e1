"""The documentation is true to the installed code.

* ``docs/api.md`` documents every public function (``dq_*``, not the internal ``dq__*``) of an
  install with its current signature, and no function that does not exist. A signature is a line
  of a ```` ```sql ```` block that starts with ``dq_`` (or ``CALL dq_`` for a procedure), with
  indented continuation lines: ``name(arguments) RETURNS result``, arguments with their names,
  types and defaults. PostgreSQL itself reads each one: the test creates a function of that
  signature in a scratch schema and compares ``pg_get_function_arguments`` and
  ``pg_get_function_result`` with the installed function's, so ``timestamptz`` and
  ``'5 minutes'`` are as good as ``timestamp with time zone`` and ``'00:05:00'::interval``.
* Every ``dq_…`` name in ``docs/api.md`` and ``docs/concepts.md`` names something of the install (a
  function, table, view, type, index or constraint); api.md opens with an index of every function and
  the role granted it.
* Every link between the pages reaches its file and heading.
* Users have no internal design documents: the docs and the README cite none.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import pytest
from docblocks import heading_anchors
from psycopg import sql

ROOT = Path(__file__).resolve().parents[2]
API = ROOT / "docs" / "api.md"
CONCEPTS = ROOT / "docs" / "concepts.md"

# Text users read never cites internal documents (design seeds, issue numbers, "not yet" notes).
FORBIDDEN = [
    re.compile(r"\bseed ", re.IGNORECASE),
    re.compile(r"Roles: not yet", re.IGNORECASE),
    # our own issue numbers ("issue 12", "#26"); another project's issue, linked, is a public source
    re.compile(r"\bissues? \d+\b(?!\]\(https?://)", re.IGNORECASE),
    re.compile(r"(?<![\w&/])#\d+\b"),
]

NAME = re.compile(r"^(?:CALL\s+)?(dq_\w+)\s*\(")


def split_signature(text: str) -> tuple[str, str, str | None]:
    """``name(arguments) [RETURNS result]`` → (name, arguments, result or None); the arguments end
    at the parenthesis that closes the first one (outside quotes)."""
    m = NAME.match(text)
    assert m, f"docs/api.md: cannot read the signature {text!r}"
    depth, quoted = 1, False
    for i in range(m.end(), len(text)):
        c = text[i]
        if c == "'":
            quoted = not quoted
        elif not quoted and c == "(":
            depth += 1
        elif not quoted and c == ")":
            depth -= 1
            if depth == 0:
                rest = text[i + 1 :].strip().rstrip(";").strip()
                if rest and not rest.startswith("RETURNS "):
                    raise AssertionError(f"docs/api.md: {text!r}: expected RETURNS after the arguments")
                return m.group(1), text[m.end() : i], rest[len("RETURNS ") :].strip() or None
    raise AssertionError(f"docs/api.md: unbalanced parentheses in {text!r}")


def documented_signatures(text: str) -> list[tuple[str, str, str | None, bool]]:
    """(name, arguments, result or None, is a procedure) of each signature line in the sql blocks."""
    entries: list[list[str]] = []
    current: list[str] | None = None  # the signature being read, None inside another statement
    in_sql = False
    for line in text.splitlines():
        if line.startswith("```"):
            in_sql, current = line.strip() == "```sql", None
            continue
        code = line.split("--", 1)[0].rstrip()
        if not in_sql or not code.strip():
            continue
        if code.startswith(("dq_", "CALL dq_")):
            current = [code]
            entries.append(current)
        elif code[:1].isspace():
            if current is not None:
                current.append(code.strip())
        else:
            current = None  # a statement of an example
    found = []
    for parts in entries:
        joined = " ".join(parts)
        found.append((*split_signature(joined), joined.startswith("CALL")))
    return found


def install_schema(conn: psycopg.Connection[Any]) -> str:
    row = conn.execute(
        "SELECT relnamespace::regnamespace::text FROM pg_class WHERE oid = 'dq_messages'::regclass"
    ).fetchone()
    assert row is not None
    return str(row[0])


def installed(conn: psycopg.Connection[Any], schema: str) -> Counter[tuple[str, str, str | None]]:
    rows = conn.execute(
        r"""SELECT p.proname, pg_get_function_arguments(p.oid), pg_get_function_result(p.oid)
              FROM pg_proc p
             WHERE p.pronamespace = %s::regnamespace AND p.proname LIKE 'dq\_%%' AND p.proname NOT LIKE 'dq\_\_%%'""",
        (schema,),
    ).fetchall()
    return Counter((name, args, result) for name, args, result in rows)


def read_by_postgres(
    conn: psycopg.Connection[Any], name: str, args: str, result: str | None, procedure: bool
) -> tuple[str, str, str | None]:
    """The signature as PostgreSQL prints it, from a scratch function declared as documented."""
    scratch = sql.Identifier("dq_docs_check")
    with conn.transaction(force_rollback=True):
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(scratch))
        if procedure:
            create = sql.SQL("CREATE PROCEDURE {}.{}(" + args + ") LANGUAGE plpgsql AS 'BEGIN END'")
        else:
            create = sql.SQL(
                "CREATE FUNCTION {}.{}(" + args + ") RETURNS " + (result or "void") + " LANGUAGE plpgsql AS 'BEGIN END'"
            )
        try:
            conn.execute(create.format(scratch, sql.Identifier(name)))
        except psycopg.Error as e:  # reported with the other stale signatures
            return (name, f"{args} (PostgreSQL cannot read it: {e})", result)
        row = conn.execute(
            "SELECT pg_get_function_arguments(p.oid), pg_get_function_result(p.oid) FROM pg_proc p "
            "WHERE p.pronamespace = 'dq_docs_check'::regnamespace"
        ).fetchone()
    assert row is not None
    return (name, row[0], row[1])


def test_api_md_documents_every_function_with_its_signature_and_no_other(conn: psycopg.Connection[Any]) -> None:
    schema = install_schema(conn)
    conn.execute(sql.SQL("SET search_path = {}, pg_temp").format(sql.Identifier(schema)))
    real = installed(conn, schema)
    assert real, "no dq_* functions installed"
    documented = Counter(
        read_by_postgres(conn, name, args, result, procedure)
        for name, args, result, procedure in documented_signatures(API.read_text(encoding="utf-8"))
    )
    missing = [f"{n}({a}) RETURNS {r}" for n, a, r in sorted(set(real) - set(documented), key=str)]
    stale = [f"{n}({a}) RETURNS {r}" for n, a, r in sorted(set(documented) - set(real), key=str)]
    assert not missing, "installed but not documented with this signature in docs/api.md:\n" + "\n".join(missing)
    assert not stale, "documented in docs/api.md but not installed (as PostgreSQL reads it):\n" + "\n".join(stale)


@pytest.mark.parametrize("page", [API, CONCEPTS], ids=lambda p: p.name)
def test_every_dq_name_in_api_md_exists(page: Path, conn: psycopg.Connection[Any]) -> None:
    schema = install_schema(conn)
    names = set(re.findall(r"\bdq_[a-z0-9_]*[a-z0-9]", page.read_text(encoding="utf-8")))
    known = {
        r[0]
        for r in conn.execute(
            """SELECT proname FROM pg_proc WHERE pronamespace = %(s)s::regnamespace
               UNION SELECT relname FROM pg_class WHERE relnamespace = %(s)s::regnamespace
               UNION SELECT typname FROM pg_type WHERE typnamespace = %(s)s::regnamespace
               UNION SELECT conname FROM pg_constraint WHERE connamespace = %(s)s::regnamespace""",
            {"s": schema},
        )
    }
    known |= {r[0] for r in conn.execute("SELECT rolname FROM pg_roles WHERE rolname LIKE 'dq%'")}
    # LISTEN channels ('dq_' || md5(queue)) and the database the examples ran in
    unknown = sorted(n for n in names - known if not re.fullmatch(r"dq_[0-9a-f]{32}", n) and n != "dq_docs")
    assert not unknown, f"docs/{page.name} names objects the install does not have: {unknown}"


def user_docs() -> list[Path]:
    return sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md", ROOT / "CHANGELOG.md"]


@pytest.mark.parametrize("path", user_docs(), ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_cite_no_internal_documents(path: Path) -> None:
    lines = path.read_text(encoding="utf-8").splitlines()
    hits = [
        f"{path.name}:{i}: {line.strip()}" for i, line in enumerate(lines, 1) for pat in FORBIDDEN if pat.search(line)
    ]
    assert not hits, "\n".join(hits)


def test_the_signature_reader_reads_overloads_procedures_and_continuations() -> None:
    text = """
```sql
dq_a(queue text, n integer DEFAULT 1) RETURNS text
dq_a(queue text, payload jsonb,
     n integer DEFAULT 1)
  RETURNS TABLE (key text, outcome text)
CALL dq_p(batch integer DEFAULT 10)
SELECT * FROM dq_stats;   -- not a signature
```

```text
dq_b(x int) RETURNS int
```
"""
    assert documented_signatures(text) == [
        ("dq_a", "queue text, n integer DEFAULT 1", "text", False),
        ("dq_a", "queue text, payload jsonb, n integer DEFAULT 1", "TABLE (key text, outcome text)", False),
        ("dq_p", "batch integer DEFAULT 10", None, True),
    ]


def imported_modules(folder: Path) -> set[str]:
    """Top-level names of the absolute imports in the .py files of ``folder`` and its subfolders."""
    import ast

    found: set[str] = set()
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return found


def test_every_runtime_dependency_is_imported_by_the_package() -> None:
    """pyproject.toml's dependencies (and the spark and otel extras) are each imported by pyqueue/."""
    import tomllib
    from importlib.metadata import packages_distributions

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras = project["optional-dependencies"]
    wanted = project["dependencies"] + extras["spark"] + extras["otel"]
    distributions = {re.split(r"[\[<>=!~; ]", req, maxsplit=1)[0].lower().replace("_", "-") for req in wanted}
    provided = {
        dist.lower().replace("_", "-")
        for module in imported_modules(ROOT / "pyqueue")
        for dist in packages_distributions().get(module, [])
    }
    assert distributions - provided == set(), f"dependencies that pyqueue/ never imports: {distributions - provided}"


#: When a message becomes a dead letter, stated in the same words wherever the docs say it (the
#: behaviour itself: tests/dead_letters/test_dead_letters.py, and docs/python.md's worker example, run by
#: tests/docs/test_docs_examples.py).
DEAD_LETTER_RULE = (
    "A message gets at most `max_deliveries` deliveries: the `dq_nack` of the last one moves it to the "
    "dead-letter queue at once (its delay is not waited), and if the lock of the last one expires instead, the next "
    "`dq_poll_many` that finds it due moves it there."
)


@pytest.mark.parametrize("name", ["README.md", "docs/api.md", "docs/python.md", "docs/operations.md"])
def test_the_docs_agree_on_when_a_message_becomes_a_dead_letter(name: str) -> None:
    text = " ".join((ROOT / name).read_text(encoding="utf-8").split())
    assert DEAD_LETTER_RULE in text, f"{name} does not state the dead-letter rule as the other docs do"
    # and no older wording that says otherwise
    assert "comes due again goes to the dead-letter queue" not in text
    assert "delivered 5 times that comes due again" not in text


@pytest.mark.parametrize("path", user_docs(), ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_select_a_configuration_row_with_its_column_names(path: Path) -> None:
    """``SELECT dq_configure_queue(…)`` prints the queue's row as one unlabeled tuple; the docs show
    ``SELECT * FROM dq_configure_queue(…)`` (or name the columns they want)."""
    text = path.read_text(encoding="utf-8")
    hits = [
        f"{path.name}:{text.count(chr(10), 0, m.start()) + 1}"
        for m in re.finditer(r"SELECT\s+dq_configure_queue\(", text)
    ]
    assert not hits, f"the bare form (an unlabeled tuple in psql) at {hits}; select its columns"


LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.mark.parametrize("path", user_docs(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_between_the_docs_reaches_its_file_and_heading(path: Path) -> None:
    """A link to another page of the repository names a file that exists, and a ``#anchor`` names a
    heading of that page (links to the web are not followed)."""
    broken = []
    fenced = False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.startswith("```"):
            fenced = not fenced
        if fenced:
            continue
        for target in LINK.findall(line):
            if re.match(r"[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            linked = (path.parent / file).resolve() if file else path
            if not linked.exists():
                broken.append(f"{path.name}:{number}: {target} (no such file)")
            elif anchor and anchor not in heading_anchors(linked):
                broken.append(f"{path.name}:{number}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_the_heading_anchors_are_read_as_github_writes_them(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Wake-ups: LISTEN/NOTIFY with a horizon\n## dq_cron_*, [dq_ack](#x)\n```sh\n# not a heading\n"
                    "```\n## Errors\n### Errors\n", encoding="utf-8")
    assert heading_anchors(page) == {"wake-ups-listennotify-with-a-horizon", "dq_cron_-dq_ack", "errors", "errors-1"}


def index_of_functions(text: str) -> dict[str, set[str]]:
    """The table under ``## Functions`` at the top of api.md: each function it names → the roles of its
    last column."""
    section = text.split("\n## Functions\n", 1)[1].split("\n## ", 1)[0]
    listed: dict[str, set[str]] = {}
    for row in section.splitlines():
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].startswith("["):
            continue
        for name in re.findall(r"\bdq_\w+", re.sub(r"\]\([^)]*\)", "]", cells[0])):
            listed[name] = set(re.findall(r"\bdq_\w+", cells[-1]))
    return listed


def test_api_md_opens_with_an_index_of_every_function_and_the_role_granted_it(conn: psycopg.Connection[Any]) -> None:
    text = API.read_text(encoding="utf-8")
    first_function = text.count("\n", 0, text.index("\n## dq_offer\n")) + 2
    assert text.index("\n## Functions\n") < text.index("\n## dq_offer\n") and first_function < 100, first_function
    listed = index_of_functions(text)
    schema = install_schema(conn)
    granted = {
        name: set(roles)
        for name, roles in conn.execute(
            r"""SELECT p.proname, array_agg(DISTINCT a.grantee::regrole::text)
                  FROM pg_proc p, aclexplode(p.proacl) a
                 WHERE p.pronamespace = %s::regnamespace AND p.proname LIKE 'dq\_%%' AND p.proname NOT LIKE 'dq\_\_%%'
                   AND a.grantee <> p.proowner AND a.privilege_type = 'EXECUTE'
                 GROUP BY p.proname""",
            (schema,),
        )
    }
    assert set(listed) == set(granted), (
        f"in the index, not installed: {sorted(set(listed) - set(granted))}; "
        f"installed, not in the index: {sorted(set(granted) - set(listed))}")
    wrong = {name: (listed[name], granted[name]) for name in listed if listed[name] != granted[name]}
    assert not wrong, f"the index names other roles than the grants (index, granted): {wrong}"


#: Folders that commands of the docs create (``make up``, ``make test``, ``make venv``, ``pip wheel``).
MADE_BY_COMMANDS = {".pgdata", ".pgdata-test", ".venv", "dist"}


@pytest.mark.parametrize("name", ["README.md", "docs/development.md"])
def test_the_files_and_folders_the_guides_name_exist(name: str) -> None:
    """Every repository path the README and the development guide write as code (``sql/``,
    ``tests/conftest.py``, ``sql/*.sql``) is in the tree."""
    text = (ROOT / name).read_text(encoding="utf-8")
    named = {
        span for span in re.findall(r"`([^`\s]+)`", text)
        if "/" in span and re.fullmatch(r"\.?[\w-]+(/[\w.*-]+)*/?", span) and span.split("/")[0] not in MADE_BY_COMMANDS
    }
    assert len(named) >= (10 if "development" in name else 0), named
    missing = sorted(path for path in named if not any(ROOT.glob(path.rstrip("/"))))
    assert not missing, f"{name} names what the tree does not have: {missing}"
