"""Driving a tree from a program: the ctl client and a private one-shot tree."""
