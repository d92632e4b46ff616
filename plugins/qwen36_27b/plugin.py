"""Placeholder: filled in by the family work."""
