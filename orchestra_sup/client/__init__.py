"""Driving a tree from a program: the ctl client, the Python SDK (`sdk.Client`, `aio.AsyncClient`)
and a private one-shot tree."""
