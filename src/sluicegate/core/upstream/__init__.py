"""An upstream's OpenAI event stream -> per-choice text, tool calls, finishes,
usage.
"""
