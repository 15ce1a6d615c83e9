"""Runs made of several training and test runs, each stage a config derived from one file with
overrides: the negative-chip pipeline (``neg_chips``: RPN -> proposals -> SNIPER -> eval)."""
