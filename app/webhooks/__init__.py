"""Webhooks: events announced to the catalog's ``notify`` endpoints, at least once."""
