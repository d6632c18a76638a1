"""unit."""
