"""Tests on the session's shared pair of vLLM workers (the `workers` and `gateway` fixtures of
tests/integration/conftest.py). One folder, so that pytest-xdist gives all of them to one worker and the
pair starts once (tests/conftest.py)."""
