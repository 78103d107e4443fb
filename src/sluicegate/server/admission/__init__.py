"""Who may call, and how much: API keys, route access, per-key quotas."""
