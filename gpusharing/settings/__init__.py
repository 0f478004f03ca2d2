"""Reading settings with messages that name what to fix: environment variables (`env`) and command-line arguments
(`arguments`)."""
