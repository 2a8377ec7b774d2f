"""The command line's commands, one module per command; each defines ``main(argv=None) -> int``.

captioner/cli.py maps command names to these modules and imports only the one asked for.
"""
