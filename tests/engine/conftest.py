"""The real-engine tier fails every test, naming the fix, when the engine venv or the tiny model is missing; its
training jobs (``grpo/jobs.py``, declared as data) are one session-wide fixture, each job run once on first use."""

from __future__ import annotations

import pytest
from enginetier import require_engine_env
from grpo.jobs import Jobs, require_job_inputs


@pytest.fixture(scope="session", autouse=True)
def engine_env() -> None:
    require_engine_env()


@pytest.fixture(scope="session")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> Jobs:
    require_job_inputs()
    return Jobs(tmp_path_factory.mktemp("jobs"))
