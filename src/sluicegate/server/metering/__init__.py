"""What each request used: its ledger row as it goes, and the Prometheus series."""
