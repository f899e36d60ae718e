"""Session authentication: who is calling, from the verified token only."""
