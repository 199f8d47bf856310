"""The machines: device presets and profiles (peak rates, measured efficiency curves) and the topology builders that turn a fabric file into a graph of devices, switches and links."""
