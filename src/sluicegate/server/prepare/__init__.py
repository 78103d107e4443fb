"""A validated request -> a ``Plan``: model, prompt, template, constraints, limits."""
