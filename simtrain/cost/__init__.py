"""The compute seam: how long an operator takes on a device (a roofline calibrated from measurements, optionally slowed per rank class)."""
