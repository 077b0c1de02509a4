"""TEST DOUBLE loader: with ``tests/npu_double`` on PYTHONPATH and ``NPU_DOUBLE`` set, install the CPU ``torch.npu``
double (see ``npu_double.py``) at interpreter start-up, before any ``import verl``."""

import os

if os.environ.get("NPU_DOUBLE"):
    import npu_double

    npu_double.install(os.environ["NPU_DOUBLE"])
