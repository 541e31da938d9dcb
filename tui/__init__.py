"""The front door: the `stepwatch` command line and the Textual app (the only package that imports textual)."""
