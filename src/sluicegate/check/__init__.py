"""``sluicegate check``, ``bench`` and ``chat``: grade, load and talk to any
OpenAI-compatible endpoint.

Probes (``framing``, ``semantics``, run by ``probes.run_probes``) are pure
functions over recorded ``transcript.Transcript``s; ``record`` is the I/O that
records them; ``stats`` summarizes load tests; ``commands`` registers the CLI.
"""
