"""RL post-training: response-length distributions for rollouts (parse a spec, sample lengths per prompt group)."""
