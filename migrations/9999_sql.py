"""Apply the functions of ``sql/`` on every apply (rules: the docstring of ``pyqueue.migrate``)."""

from pathlib import Path

from yoyo import step

from pyqueue.migrate import apply_functions

__depends__: set[str] = set()

steps = [step(lambda conn: apply_functions(conn, Path(__file__).resolve().parent))]
