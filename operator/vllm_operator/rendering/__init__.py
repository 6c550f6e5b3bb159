"""rendering."""
