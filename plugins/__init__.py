"""Built-in plugins of ninfer. Each folder is one plugin, registered through the `ninfer` entry points."""
