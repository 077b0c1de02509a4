"""``python -m verl_ascend_ext.tooling.selftest ARGS``: the same as ``verl-ascend selftest ARGS`` (recipe check runs
it this way, in its own process)."""

import sys

from verl_ascend_ext.tooling.selftest.cli import main

sys.exit(main())
