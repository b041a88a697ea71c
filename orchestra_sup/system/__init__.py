"""OS seams: what the machine allows and how a process is confined, tracked and named."""
