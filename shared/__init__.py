"""What both services share: the wire contract, the settings model, logging, the CLI."""
