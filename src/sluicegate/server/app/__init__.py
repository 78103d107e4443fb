"""The server's assembly: the Starlette app, the command-line options, the
playground, the worker processes.
"""
