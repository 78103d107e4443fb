"""sluicegate.server."""
