"""Web research services behind small interfaces: search backends, page readers, a disk cache
and the settings that choose them. The `search` and `visit` tools use them; nothing here knows
about the agent loop."""
