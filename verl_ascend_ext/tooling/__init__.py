"""What users run by hand: the ``verl-ascend`` CLI, doctor, vet, the patch catalogue, the Ray cluster
tools and the recipes. Never imported at discovery."""
