"""Stage 7: what a run reports: time attribution, the critical path, the Chrome trace, figures and the JSON files."""
