"""The real-engine tier fails every test, naming the fix, when the engine venv or the tiny model is missing."""

from __future__ import annotations

import pytest
from enginetier import require_engine_env


@pytest.fixture(scope="session", autouse=True)
def engine_env() -> None:
    require_engine_env()
