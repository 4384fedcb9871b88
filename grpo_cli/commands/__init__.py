"""One module per subcommand: options, checks, then lazy imports."""
