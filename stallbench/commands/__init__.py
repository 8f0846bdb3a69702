"""Subcommands: each module offers ``add_parser(subparsers)`` and ``run(args) -> int``."""
