"""sluicegate: an OpenAI-compatible LLM serving front end that streams correctly."""

__all__ = ["__version__"]

__version__ = "0.1.0"
