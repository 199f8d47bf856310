"""Stage 1 of the pipeline: the input files (scenario YAML, Hugging Face config.json, overrides) read into a frozen Scenario in SI units, with every error of a file collected and reported at once."""
