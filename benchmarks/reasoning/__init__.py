"""Reasoning benchmarks: sampled branches, their votes against greedy, SART and DeepConf replays on saved branches,
and the scorers that judge partial branches."""
