"""Devices built into the core."""
