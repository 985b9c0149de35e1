"""Keep ``9999_sql`` pending, so every apply re-checks ``sql/`` (rules: the docstring of ``pyqueue.migrate``)."""

from yoyo import step

from pyqueue.migrate import FORGET_FUNCTION_STEP

steps = [step(FORGET_FUNCTION_STEP)]
