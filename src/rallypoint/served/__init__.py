"""What is served (pure): the env, TF_CONFIG, the user's overrides, output formats, the hostfile."""
