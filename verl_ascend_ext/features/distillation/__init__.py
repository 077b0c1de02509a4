"""Distillation fixes for verl 0.9.0: the ``fsdp2`` strategy and teacher-field padding."""
