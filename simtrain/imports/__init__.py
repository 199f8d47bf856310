"""Importers of other frameworks' configurations (Megatron-LM arguments, DeepSpeed JSON,
torchtitan TOML, verl trainer YAML) into simtrain scenario trees: an input stage beside `spec`."""
