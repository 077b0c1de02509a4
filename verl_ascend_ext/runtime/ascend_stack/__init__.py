"""This machine's Ascend software stack (CANN toolkit, NNAL/ATB, driver, firmware, npu-smi), read from files only.

Below the features and the tooling: the doctor's Ascend section (``tooling.ascend_env``) and what a node reports to
the cluster check at a job's start (``features.device.node_inventory``) read the same files the same way.
"""
