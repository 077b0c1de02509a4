"""Cluster checks: ``verl-ascend doctor --ray`` runs the static doctor on every node of a Ray cluster and compares."""
