"""The root supervisor: child specs, restarts, the control record and the ctl endpoint."""
