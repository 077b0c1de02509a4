"""Checkpoint export safety: export check with declared omissions, transformer config saved whole."""
