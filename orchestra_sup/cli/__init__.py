"""The `orchestra-sup` command: its command groups and how they show answers."""
