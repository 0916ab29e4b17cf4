"""`python -m api.cli ...`, the same as the `loraplex` command."""

from api.cli.main import main

main()
