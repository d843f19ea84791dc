"""Experiment runners: one per paper table, plus the end-to-end demo. Each writes results.json."""
