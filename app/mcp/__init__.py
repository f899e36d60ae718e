"""The MCP front door: toolgate as an MCP server that gates every tool call."""
