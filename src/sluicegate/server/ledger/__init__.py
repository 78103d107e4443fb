"""The request ledger's storage: SQLite or PostgreSQL, one writer thread, reads."""
