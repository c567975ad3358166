"""The conformance tests, one module per level."""
