"""Scripts the tests run in fresh interpreters; each prints one JSON line of observations."""
