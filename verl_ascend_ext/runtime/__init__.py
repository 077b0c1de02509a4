"""What runs in every process of a training job: discovery (boot), the feature registry, the hook
specification and the per-process status record. Imports only the standard library, pluggy, wrapt
and packaging at discovery."""
