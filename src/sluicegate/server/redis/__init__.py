"""State shared between replicas in Redis: resumable logs, cancels, quotas."""
