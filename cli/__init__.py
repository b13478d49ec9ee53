"""The `tuneline` command line: parses, validates, then hands work to the flows."""
