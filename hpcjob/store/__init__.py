"""What lives on disk or on the share: profiles, secrets' sources, the run history, logs, staged code."""
