"""Where resumable streams' frames are kept: the store protocol, and the in-memory
store.
"""
