"""Rollout memory after sleep: what each rollout worker keeps on its device after every sleep, as a metric of the
step, a trend warning long before vLLM-Ascend's "Memory usage increased after sleeping." assert, and that assert as
an error naming the series and the fix."""
