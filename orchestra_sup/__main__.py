"""`python -m orchestra_sup` is `orchestra-sup`."""

from orchestra_sup.cli.app import main

main()
