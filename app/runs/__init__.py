"""Runs: budgets that stop runaway agent loops (SPEC §4 Runs)."""
