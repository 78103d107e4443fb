"""Stream events -> wire bytes: SSE, the chunk builders, one stream machine per
wire API.
"""
