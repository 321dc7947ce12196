"""Configuration: schema (defaults and docs) and the YAML loader that validates it."""
