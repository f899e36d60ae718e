"""toolgate: an HTTP authorization service for LLM-agent tool calls."""
