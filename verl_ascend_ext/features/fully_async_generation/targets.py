"""The fully-async generation feature's patch id, for its patch code: the declaration imports pluggy (through the
hook specs), which the patch code must not load."""

from __future__ import annotations

GENERATION_ID = "fully-async-generation-fails-closed"
