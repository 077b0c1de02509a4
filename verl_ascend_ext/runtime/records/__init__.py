"""Process records: what really ran in each process of a job, and how it ended (``verl-ascend status``).

One module per concern: ``schema`` (the record's fields, roles and endings, the one factory, the previous
schema's upgrade), ``store`` (the private directory, atomic writes), ``identity`` (who a process is: role, ranks,
liveness), ``recorder`` (this process's own record, its only writer), ``process_end`` (how this process ended),
``reader`` (reading a directory; never writes), ``prune`` (removing old records: an explicit step), ``report``
(what ``status`` shows: counts per patch and role, problems) and ``outcome`` (how the job ended, what failed
first). The boot loads ``schema``, ``store``, ``identity``, ``recorder`` and ``process_end`` only.
"""
