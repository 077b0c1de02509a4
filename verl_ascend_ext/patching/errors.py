"""Errors of the patch engine (importable without loading the engine)."""


class PatchRefusedError(RuntimeError):
    """A gated patch met code it does not recognise; nothing was changed."""
