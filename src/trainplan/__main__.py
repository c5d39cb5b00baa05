"""`python -m trainplan …`: the same commands as the `trainplan` script."""

from .cli import main

main()
