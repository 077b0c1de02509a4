"""What runs in every process of a training job: discovery (boot, its plan and the generated manifest), the feature
registry, the hook specification and the per-process records. Imports only the standard library at discovery (wrapt
when a hooked module is imported; pluggy and packaging where another distribution declares features)."""
