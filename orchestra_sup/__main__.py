"""`python -m orchestra_sup` is `orchestra-sup`."""

from orchestra_sup.cli import main

main()
