"""Request bodies as the wire APIs send them, validated (pydantic models)."""
