"""The tool catalog: YAML parsed once into frozen, compiled models (SPEC §3)."""
