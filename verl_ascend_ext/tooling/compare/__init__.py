"""`verl-ascend compare`: two runs' own verl metrics and the plugin's statuses, judged side by side, noise-aware.

``runs`` (reading a console log, a file logger's output, a baseline), ``rules`` (what is judged), ``judge`` (bound
and noise), ``nonfinite`` (a NaN or inf at any step of any metric), ``status_side`` (statuses per role), ``baseline``
(writing one), ``picture`` (the PNG), ``cli``.
"""
