"""The command line: `simtrain run | check | compare | schedule | search | sweep | reliability | bench | calibrate | list`."""
