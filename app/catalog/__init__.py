"""The tool catalog: YAML parsed once into frozen, compiled models (docs/catalog.md)."""
