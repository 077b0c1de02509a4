"""One package per feature, each named as its entry point in the ``verl_ascend_ext.features`` entry-point group:
``declaration`` (records, gates, hook implementations: loaded with the registry, at the first import of a target or,
where another distribution declares features, at discovery), ``patch_code`` (the replacement code, loaded when a
target is imported) and modules of the feature's own."""
