"""%loadertune: passes, recommendation, worker shutdown, the magic."""
