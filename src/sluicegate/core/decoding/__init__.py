"""Token ids -> safe text: detokenizers, stop strings, reasoning and tool-call
parsers.
"""
