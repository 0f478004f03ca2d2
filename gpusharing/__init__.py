"""The core shared by the webhook, the timekeeper and the meter: the GPU request model, units and contracts."""
