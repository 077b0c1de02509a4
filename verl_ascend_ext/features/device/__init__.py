"""Ascend device hooks: verl's NPU platform with loud allocator settings and gate-carrying rollout env,
and this package's gates carried into the Ray runtime environment of every PPO job."""
