"""The recipe: schema, files and overrides, checks across sections, TRL conversion. Never imports torch."""
