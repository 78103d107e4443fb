"""Integration tests: real sluicegate servers driven over HTTP."""
