"""Keep ``9999_sql`` pending, so every ``yoyo apply`` re-checks the functions of ``sql/``.

yoyo runs post-apply hooks only when some migration was pending; ``9999_sql`` always is,
because this hook removes its mark after each run. ``yoyo list`` therefore shows it as
unapplied: that is by design (see 9999_sql.py and the README's development section).
"""

from yoyo import step

steps = [step("DELETE FROM _yoyo_migration WHERE migration_id = '9999_sql'")]
