"""Worker shards: run lanes (one shell command each) in their own process groups."""
