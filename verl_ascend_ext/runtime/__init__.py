"""What runs in every process of a training job: discovery (boot, its plan and the generated manifest), the feature
registry, the hook specification and the per-process status record. Imports only the standard library and wrapt at
discovery (pluggy too, and packaging, where another distribution declares features)."""
