"""`python -m appliance` and the frozen executable's entry point: the `eie` command."""

from appliance.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
