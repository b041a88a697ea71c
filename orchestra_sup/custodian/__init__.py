"""The tree custodian: owns the git workspace, hands out lane sandboxes and serves read tools."""
