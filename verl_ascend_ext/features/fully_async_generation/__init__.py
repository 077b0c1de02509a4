"""A failed fully-async rollout generation fails the job instead of ending its data (verl #6387)."""
