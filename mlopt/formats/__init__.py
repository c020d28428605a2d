"""Versioned file formats: topology, model trace, plan envelope; readers, writers and importers."""
