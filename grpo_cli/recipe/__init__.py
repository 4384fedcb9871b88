"""The recipe: schema, files and overrides, checks across sections, TRL conversion, and the torch-free tables its
choices and rules read (specs.py: loss types, advantage estimators, optimizers; backends.py: rollout backends;
names.py: the grammar of the names a recipe gives code). Imports only errors, the registry and itself; never torch."""
