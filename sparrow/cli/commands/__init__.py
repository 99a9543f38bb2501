"""One module per `sparrow` subcommand."""
