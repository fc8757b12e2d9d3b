"""Test set-up: the graph verifier runs between passes; a private compile cache per session."""
import os
import tempfile

os.environ.setdefault("HYBRID_CHECK", "1")
os.environ.setdefault("HYBRID_CACHE_DIR", tempfile.mkdtemp(prefix="hybrid-test-cache-"))
os.environ.setdefault("HYBRID_WAIT_TIMEOUT", "120")
