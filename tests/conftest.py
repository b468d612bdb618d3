"""Shared fixtures; helpers live in helpers.py (importable because pytest puts tests/ on the path)."""

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")

from helpers import make_task  # noqa: E402


@pytest.fixture
def pipeline_task():
    return make_task()
