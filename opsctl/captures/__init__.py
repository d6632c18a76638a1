"""captures."""
