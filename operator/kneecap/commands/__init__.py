"""One module per CLI subcommand: each exposes ``add_arguments(parser)`` and ``run(args) -> int``."""
