"""The upstream engine: OpenAI-compatible upstream servers, pooled, with failover."""
