"""The routes of each wire API: chat and completions, Responses, Messages, info."""
