"""`verl-ascend selftest`: prove on this node, in about a minute, that each fix that changes numbers holds eagerly,
compiled and in captured device graphs.

Modules: ``cli`` (arguments, output, exit code), ``runner`` (records x modes, released vs fixed), ``checks`` (per
patched target: how to build it small, its inputs and the intended maths), ``stacks`` (the installed vLLM-Ascend on
an NPU, or vLLM-Ascend's released source on the test double), ``devices`` (NPU / CUDA / CPU, compile backends,
graph capture), ``compare`` (float64 references, tolerances), ``store`` (the last result per host, for ``status``
and ``doctor``), ``npu_test_double`` (the TEST DOUBLE of torch_npu's kernels used off an NPU). Only ``store`` is
imported by other commands; it imports no torch.
"""

DEVICES = ("auto", "npu", "cuda", "cpu")  # --device choices (auto: an NPU, else a CUDA GPU, else the CPU)
DOUBLE_LABEL = "test double, not this stack"  # on every result line that ran on the NPU test double
