"""Optional integrations with frameworks, each behind its own extra (``pgdelayq[django]`` …); nothing
here is imported by ``import pyqueue``."""
