"""MLServer's forms: model-settings.json folders."""
