"""Approvals: a human's decision on exactly what a dry-run showed."""
