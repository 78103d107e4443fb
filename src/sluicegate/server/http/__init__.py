"""HTTP plumbing below the routes: bodies, chunked framing, connection limits,
CORS, errors and their answers.
"""
