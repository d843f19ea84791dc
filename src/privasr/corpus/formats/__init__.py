"""Readers and writers, one module per on-disk format, each converting to and from the corpus records."""
