"""Developer tools of the repository (not in the provider wheel): ``python -m tools.<name>``."""
