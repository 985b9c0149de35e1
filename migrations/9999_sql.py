"""Apply the function definitions of ``sql/`` (the one place where function bodies live).

This step is re-run by every ``yoyo apply``: ``post-apply.py`` removes its mark from
``_yoyo_migration`` each time, so it is always pending. It re-creates the functions only when
the checksum of ``sql/`` and of the list of applied schema steps differs from the one recorded
in ``dq_meta`` (so a deploy with unchanged functions takes no locks on them). Plain ``yoyo apply`` and ``pyqueue migrate``
therefore reach the same state, including a change to ``sql/`` alone (yoyo 9 runs post-apply
hooks only when some migration is pending; this one always is).

Schema changes are ordinary numbered steps (0001_…, 0002_…) that sort before this one.
"""

import hashlib
from pathlib import Path

from yoyo import step

__depends__: set[str] = set()


def _sql_dir() -> Path:
    here = Path(__file__).resolve().parent
    for candidate in (here.parent / "sql", here.parent / "_sql"):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"no sql/ directory beside {here}")


def _apply_sql(conn) -> None:  # type: ignore[no-untyped-def]
    files = sorted(_sql_dir().glob("*.sql"))
    digest = hashlib.sha256()
    texts = []
    for path in files:
        text = path.read_text(encoding="utf-8")
        digest.update(path.name.encode() + b"\0" + text.encode() + b"\0")
        texts.append(text)
    cur = conn.cursor()
    # The applied schema steps are part of the checksum: a new migration (which may have dropped
    # a function or a type it depends on) always leads to the functions being re-created.
    cur.execute("SELECT migration_id FROM _yoyo_migration WHERE migration_id <> '9999_sql' ORDER BY 1")
    for (migration_id,) in cur.fetchall():
        digest.update(b"migration:" + migration_id.encode() + b"\0")
    checksum = digest.hexdigest()
    cur.execute("SELECT value FROM dq_meta WHERE name = 'sql_checksum'")
    row = cur.fetchone()
    if row is not None and row[0] == checksum:
        return
    for text in texts:
        cur.execute(text)
    cur.execute(
        "INSERT INTO dq_meta (name, value) VALUES ('sql_checksum', %s) "
        "ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value, updated_at = now()",
        (checksum,),
    )


steps = [step(_apply_sql)]
