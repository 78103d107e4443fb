"""One generation to one client: the outbox, the buffers, the writers, the
responses.
"""
