"""An engine in a process of its own: the host that serves it, and the engine the
workers use.
"""
