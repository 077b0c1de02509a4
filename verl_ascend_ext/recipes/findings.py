"""The findings of `verl-ascend recipe check`: the package's one ``Finding`` type (see ``verl_ascend_ext.findings``)."""

from __future__ import annotations

from ..findings import ERROR, INFO, NOT_CHECKED, OK, WARN, Finding, Severity

__all__ = ["ERROR", "INFO", "NOT_CHECKED", "OK", "WARN", "Finding", "Severity"]
