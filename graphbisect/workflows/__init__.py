"""Workflows: the end-to-end jobs behind each CLI command (compare, reduce), usable as a library."""
