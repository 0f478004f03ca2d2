"""What `make constraints`, `make dist` and `make image` run: not part of the installed package."""
