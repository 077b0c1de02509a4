"""R3 route check: the rollout's routes checked before the actor replays them, and their agreement with the actor."""
