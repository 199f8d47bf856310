"""Studies on top of the step simulation: the closed-form estimate, compare, sweep, search and the reliability (goodput) model."""
