"""Model-free engines that replay scripts, with injectable faults (tests,
benchmarks).
"""
