"""Stage 6: the SimPy discrete-event engine that runs the programs and records a timeline."""
