"""The llama.cpp engine: continuous batching over a GGUF model in one worker
thread.
"""
