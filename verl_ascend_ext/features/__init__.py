"""One package per feature, each named as its entry point in the ``verl_ascend_ext.features`` entry-point group:
``declaration`` (records, gates, hook implementations: loaded at discovery), ``patch_code`` (the
replacement code, loaded when a target is imported) and modules of the feature's own."""
