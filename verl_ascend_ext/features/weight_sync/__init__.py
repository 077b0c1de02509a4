"""Weight-sync fixes for verl releases without them: barrier before KV resume, no full GC on the sync path."""
