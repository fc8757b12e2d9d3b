"""The ``HYBRID_*`` flags: one declaration, in runtime/config.py, seen from the front end."""
from runtime.config import FLAGS, cache_dir, describe, get, log_enabled, logger, set_flag  # noqa: F401
