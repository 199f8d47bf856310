"""Stage 2: the model and training setup turned into per-layer operator templates (FLOP, bytes, activation bytes, forward / backward split, tp/cp/ep communication sizes) and their memory."""
