"""Thin Typer wrappers: parse options, call the plain function that does the work."""
